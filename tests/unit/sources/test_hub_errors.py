"""What a hub's (or a peer's) answers mean, read in one place: the status tables, Retry-After, the one
failure type. The expected tables are the behaviour the resolvers, the download engine and the peer
client had before the tables moved here, written out status by status."""

import time
from email.utils import formatdate

import pytest

from gpustack_models.plugin.engine.failures import REASONS, DownloadFailed
from gpustack_models.sources import SourceError, hub_errors
from gpustack_models.sources.hub_errors import (
    ACCESS_DENIED,
    BUSY,
    EMPTY_MANIFEST,
    INTEGRITY_MISMATCH,
    INVALID_MANIFEST,
    INVALID_REQUEST,
    MISSING,
    NOT_HELD,
    REVISION_NOT_FOUND,
    SOURCE_UNAVAILABLE,
    AccessDenied,
    EmptyManifest,
    Failure,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
    api_reason,
    error_code_detail,
    failure,
    file_reason,
    modelscope_reason,
    peer_reason,
    retry_after_seconds,
    transient,
)

STATUSES = range(100, 600)
NOW = 1445412470.0  # Wed, 21 Oct 2015 07:27:50 GMT

# --------------------------------------------------------------------------------------------------
# Statuses
# --------------------------------------------------------------------------------------------------


def test_it_retries_429_and_every_5xx_and_nothing_else():
    assert [s for s in STATUSES if transient(s)] == [429, *range(500, 600)]


def test_it_reads_a_hubs_api_answers():
    # A model's info or file listing: 401, 403, 404 refuse; 429 and 5xx are the hub unavailable (the
    # transport fails them at once), anything else an unexpected answer: unavailable too.
    for status in STATUSES:
        expected = ACCESS_DENIED if status in (401, 403, 404) else SOURCE_UNAVAILABLE
        assert api_reason(status) == expected, status
    assert api_reason(None) == SOURCE_UNAVAILABLE  # an error without an answer


def test_it_reads_a_hubs_answers_to_a_byte_range():
    for status in set(STATUSES) - {200, 206}:
        if status in (401, 403, 404, 410):
            expected = ACCESS_DENIED
        elif status == 416:
            expected = INTEGRITY_MISMATCH  # the hub's file is shorter than the manifest says
        elif status in (400, 422):
            expected = INVALID_REQUEST
        else:
            expected = SOURCE_UNAVAILABLE  # 429 and 5xx after the retries; anything else unexpected
        assert file_reason(status) == expected, status
    assert {file_reason(s) for s in (401, 403, 404, 410, 416, 400, 422)} <= set(REASONS)


def test_it_reads_a_peers_answers():
    for status in set(STATUSES) - {206}:
        expected = {401: ACCESS_DENIED, 403: ACCESS_DENIED, 404: ACCESS_DENIED, 416: NOT_HELD, 503: BUSY}
        assert peer_reason(status) == expected.get(status, SOURCE_UNAVAILABLE), status
    for status in set(STATUSES) - {200}:
        expected = {401: ACCESS_DENIED, 403: ACCESS_DENIED, 404: NOT_HELD, 503: BUSY}  # 404: nothing held yet
        assert peer_reason(status, tree=True) == expected.get(status, SOURCE_UNAVAILABLE), status
    for status in (410, 429, 500, 502, 504):  # a hub's, not a peer's: a failure counted against the peer
        assert peer_reason(status) == SOURCE_UNAVAILABLE


# The business codes ModelScope refuses with (even with HTTP 200), as its client hands them over.
MODELSCOPE = [
    (401, ACCESS_DENIED),
    ("403", ACCESS_DENIED),
    (10010103009, ACCESS_DENIED),  # AccessToken is invalid or expired
    ("InvalidAuthentication", ACCESS_DENIED),
    ("OperationNotAllowed", ACCESS_DENIED),
    (404, MISSING),
    (400, MISSING),
    ("ResourceNotFound", MISSING),
    ("InputParameterError", MISSING),
    (" 404 ", MISSING),
    (429, SOURCE_UNAVAILABLE),
    ("RateLimitExceed", SOURCE_UNAVAILABLE),
    (500, SOURCE_UNAVAILABLE),
    (503, SOURCE_UNAVAILABLE),
    (10030000001, SOURCE_UNAVAILABLE),  # a retryable commit conflict: not a read's answer
    ("QuotaLimitExceed", SOURCE_UNAVAILABLE),
    (10010101001, SOURCE_UNAVAILABLE),  # model already exists
    (200, SOURCE_UNAVAILABLE),  # "Success": false with Code 200
    (99999999999, SOURCE_UNAVAILABLE),  # a code nobody knows yet
    (None, SOURCE_UNAVAILABLE),
    ("resourcenotfound", SOURCE_UNAVAILABLE),  # names are matched exactly
]


@pytest.mark.parametrize("code, expected", MODELSCOPE, ids=[repr(c) for c, _ in MODELSCOPE])
def test_it_reads_modelscopes_business_codes(code, expected):
    assert modelscope_reason(code) == expected


def test_it_shows_a_hubs_error_code_but_not_its_message():
    assert error_code_detail("GatedRepo") == " (GatedRepo)"
    assert error_code_detail("x" * 100) == " (" + "x" * 64 + ")"
    assert error_code_detail("Repo\nNotFound") == ""
    assert error_code_detail("") == "" and error_code_detail(None) == ""


def test_it_says_who_may_not_see_a_repository():
    assert "no token was given" in hub_errors.missing_repository(False)
    assert "secretRef" in hub_errors.missing_repository(False)
    assert "the token given has no access" in hub_errors.missing_repository(True)


# --------------------------------------------------------------------------------------------------
# Retry-After
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("5", 5.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),  # not RFC's delay-seconds, but some hubs send it
        (3, 3.0),  # a number a hub client read already
        (2.5, 2.5),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 10.0),  # IMF-fixdate
        ("Wednesday, 21-Oct-15 07:28:00 GMT", 10.0),  # RFC 850
        ("Wed Oct 21 07:28:00 2015", 10.0),  # asctime
        ("Wed, 21 Oct 2015 08:27:50 GMT", 3600.0),
        ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),  # past: now
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
    ],
)
def test_it_reads_retry_after_in_seconds_or_as_a_date(value, seconds):
    assert retry_after_seconds(value, now=NOW) == seconds


@pytest.mark.parametrize(
    "value",
    [None, "", "   ", "soon", "5 minutes", "5s", "nan", "0x10", "Wed, 32 Oct 2015 07:28:00 GMT", "Mon, garbage", True],
)
def test_it_reads_no_wait_from_garbage(value):
    assert retry_after_seconds(value, now=NOW) is None


@pytest.mark.parametrize("value", ["-1", " -0.5 ", -3, -1e9])
def test_it_reads_no_wait_from_a_negative_number(value):
    assert retry_after_seconds(value, now=NOW) is None


def test_it_keeps_a_huge_wait_for_the_callers_to_cap():
    assert retry_after_seconds("86400000") == 86400000.0
    assert retry_after_seconds("99999999999999999999") == 1e20
    assert retry_after_seconds("1e400") == float("inf")
    assert retry_after_seconds(10**400) == float("inf")  # an int no float holds
    assert retry_after_seconds("Fri, 31 Dec 9999 23:59:59 GMT", now=NOW) > 250_000_000_000


def test_it_counts_a_date_from_the_current_time_by_default():
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    in_an_hour = formatdate(time.time() + 3600, usegmt=True)
    assert 3590 < retry_after_seconds(in_an_hour) <= 3600


# --------------------------------------------------------------------------------------------------
# The failure type
# --------------------------------------------------------------------------------------------------


def test_a_failure_carries_reason_message_and_retry_after():
    failed = Failure(SOURCE_UNAVAILABLE, "GET https://hub answered HTTP 503", retry_after=30.0)
    assert (failed.reason, failed.message, failed.retry_after) == (SOURCE_UNAVAILABLE, failed.message, 30.0)
    assert str(failed) == "SourceUnavailable: GET https://hub answered HTTP 503"
    assert repr(failed) == "Failure('SourceUnavailable', 'GET https://hub answered HTTP 503')"
    assert failed.args == ("GET https://hub answered HTTP 503",)
    assert Failure(ACCESS_DENIED, "no").retry_after is None


def test_only_an_unavailable_hub_is_worth_asking_again():
    assert Failure(SOURCE_UNAVAILABLE, "x").retryable and SourceUnavailable("x").retryable
    for reason in (ACCESS_DENIED, REVISION_NOT_FOUND, EMPTY_MANIFEST, INVALID_MANIFEST, INVALID_REQUEST):
        assert not failure(reason, "x").retryable, reason


@pytest.mark.parametrize(
    "reason, cls",
    [
        (ACCESS_DENIED, AccessDenied),
        (REVISION_NOT_FOUND, RevisionNotFound),
        (SOURCE_UNAVAILABLE, SourceUnavailable),
        (EMPTY_MANIFEST, EmptyManifest),
        (INVALID_MANIFEST, InvalidManifest),
    ],
)
def test_resolutions_failures_are_named_after_their_reason(reason, cls):
    made = failure(reason, "at main", retry_after=4.0)
    assert type(made) is cls and made.reason == reason and made.retry_after == 4.0
    direct = cls("at main")
    assert isinstance(direct, SourceError) and direct.reason == reason and direct.retry_after is None
    assert str(direct) == f"{reason}: at main" and repr(direct) == f"{cls.__name__}({reason!r}, 'at main')"


def test_a_reason_without_a_class_makes_a_plain_failure():
    made = failure(INTEGRITY_MISMATCH, "short file")
    assert type(made) is Failure and made.reason == INTEGRITY_MISMATCH


def test_a_download_failure_is_the_same_type_with_the_nodes_reasons_only():
    failed = DownloadFailed(ACCESS_DENIED, "refused", retry_after=9.0)
    assert isinstance(failed, Failure) and failed.retry_after == 9.0
    assert repr(failed) == "DownloadFailed('AccessDenied', 'refused')" and str(failed) == "AccessDenied: refused"
    with pytest.raises(ValueError, match="unknown failure reason"):
        DownloadFailed(REVISION_NOT_FOUND, "a resolution's reason, not a node's")
    with pytest.raises(Failure):  # one except clause catches resolution's and downloads' failures alike
        raise failed
    assert SourceError is Failure
