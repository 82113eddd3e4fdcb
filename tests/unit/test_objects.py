"""The object store's pure parts (issue 36, item 2): the store's address, the reference a
row keeps, and the one line each store failure becomes (botocore's own errors, built as
boto3 raises them)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from kenning.errors import ConfigurationError
from kenning.objects import Location, Reference, payloads
from kenning.objects.offload import encoded, has_references
from kenning.objects.store import describe


def test_the_store_address_is_a_bucket_and_a_prefix_and_a_wrong_one_names_the_setting() -> None:
    assert Location.parse("s3://bucket/some/prefix/") == Location("bucket", "some/prefix")
    assert Location.parse("s3://bucket") == Location("bucket", "")
    location = Location.parse("s3://bucket/p")
    # an instance id is quoted: a slash in it cannot reach into another instance's objects
    assert location.instance_prefix("a/b") == "p/a%2Fb/"
    for wrong in ("bucket/prefix", "s3://", "https://bucket"):
        with pytest.raises(ConfigurationError, match="KENNING_OBJECT_STORE"):
            Location.parse(wrong)


def test_a_reference_is_exactly_its_three_keys() -> None:
    ref = {"$ref": "s3://b/p/i/abc", "size": 3, "sha256": "abc"}
    assert Reference.of(ref) == Reference("s3://b/p/i/abc", 3, "abc")
    assert Reference.of({**ref, "other": 1}) is None  # a user's dict that only looks alike
    assert Reference.of({**ref, "$ref": "https://elsewhere"}) is None
    assert has_references({"result": ref}) and has_references({"data": {"result": ref}})
    assert not has_references({"result": {"$ref": "#/definitions/x"}})


def test_without_a_store_or_below_the_threshold_a_value_stays_in_its_row() -> None:
    try:
        payloads.configure("", 1024)
        assert payloads.offloaded("x" * 1_000_000) == "x" * 1_000_000
        small = {"a": [1, 2, 3]}
        payloads.configure("s3://b/p", len(encoded(small)))
        assert payloads.offloaded(small) is small
        ref = {"$ref": "s3://b/p/i/abc", "size": 3_000_000, "sha256": "abc"}
        assert payloads.offloaded(ref) is ref  # sealed twice: a reference stays one
    finally:
        payloads.reset()


def test_a_value_over_a_rows_limit_names_the_setting_that_lifts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(payloads.STORE_VARIABLE, raising=False)
    payloads.reset()
    line = payloads.too_large("published value 'k'", 300_000, 262_144)
    assert "set KENNING_OBJECT_STORE" in line and "300000" in line and "\n" not in line
    monkeypatch.setenv(payloads.BYTES_VARIABLE, "-1")
    with pytest.raises(ConfigurationError, match="KENNING_OFFLOAD_BYTES"):
        payloads.configure()
    payloads.reset()


def test_each_store_failure_is_one_line_naming_what_to_fix() -> None:
    def error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")

    lines = {
        "bucket": describe(error("NoSuchBucket"), "writing s3://b/k", "b"),
        "object": describe(error("NoSuchKey"), "reading s3://b/k", "b", reading=True),
        "credentials": describe(error("InvalidAccessKeyId"), "writing s3://b/k", "b"),
        "none": describe(NoCredentialsError(), "writing s3://b/k", "b"),
        "endpoint": describe(EndpointConnectionError(endpoint_url="http://x"), "writing s3://b/k", "b"),
    }
    assert "bucket 'b' does not exist" in str(lines["bucket"]) and "KENNING_OBJECT_STORE" in str(lines["bucket"])
    assert "the object is missing" in str(lines["object"])
    assert "AWS_ACCESS_KEY_ID" in str(lines["credentials"]) and "AWS_ACCESS_KEY_ID" in str(lines["none"])
    assert "does not answer" in str(lines["endpoint"]) and "AWS_ENDPOINT_URL" in str(lines["endpoint"])
    assert all("\n" not in str(line) and str(line).startswith(("writing", "reading")) for line in lines.values())
