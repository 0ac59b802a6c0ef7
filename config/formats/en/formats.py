"""Times on the stock admin pages (a readonly field, a list's column) as on the console's own pages and in
Kubernetes: RFC 3339 in UTC to the second, ``2026-12-04T21:48:50Z``, the form of
``kinds.formatting.timestamp``. ``TIME_ZONE`` is ``UTC``, so the ``Z`` is true."""

DATETIME_FORMAT = SHORT_DATETIME_FORMAT = r"Y-m-d\TH:i:s\Z"
DATE_FORMAT = SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = r"H:i:s\Z"
