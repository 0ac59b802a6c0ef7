"""Development only: the local Kubernetes control plane, a launcher that installs the service into it,
and a small PKI. Not part of the image; ``manage.py runlocal`` and ``manage.py localcluster`` come from
here (a Django app of its own, installed only where this package exists)."""
