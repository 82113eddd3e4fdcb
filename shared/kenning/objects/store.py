"""An S3-compatible object store: where values too large for a row are kept.

boto3, the field's standard client: it reads credentials, the region and the endpoint
(``AWS_ENDPOINT_URL``) as every AWS SDK does, and retries throttling on its own. It is
synchronous, so each call runs in a thread; a value is one ``PUT`` of bytes already in
memory (the JSON the row would have held) and a read is streamed from the response body,
so an async client would save no memory, only a thread per call in flight. boto3 is
imported on the first call: a process with no store set never loads it.

Every failure is an ``ObjectStoreError`` whose message is one line naming what to fix.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from kenning.errors import ConfigurationError, ObjectStoreError

SCHEME = "s3://"
_DELETE_BATCH = 1000  # S3's DeleteObjects takes at most 1000 keys
CHUNK_BYTES = 1024 * 1024  # a streamed read's piece


@dataclass(frozen=True)
class Location:
    """``s3://bucket/prefix``: a bucket and the key prefix Kenning's objects live under."""

    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    @classmethod
    def parse(cls, url: str, what: str = "KENNING_OBJECT_STORE (--object-store)") -> Location:
        if not url.startswith(SCHEME):
            raise ConfigurationError(f"{what} must be s3://bucket[/prefix], got {url!r}")
        bucket, _, prefix = url[len(SCHEME) :].partition("/")
        if not bucket:
            raise ConfigurationError(f"{what} names no bucket: {url!r} (s3://bucket[/prefix])")
        return cls(bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def instance_prefix(self, instance_id: str) -> str:
        """The prefix of one instance's objects (its id quoted: a ``/`` in it cannot reach
        into another instance's objects)."""
        return self.key(quote(instance_id, safe="")) + "/"

    def url(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"

    def __str__(self) -> str:
        return self.url(self.prefix)


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of an object's ``s3://bucket/key``."""
    if not url.startswith(SCHEME) or "/" not in url[len(SCHEME) :]:
        raise ObjectStoreError(f"{url!r} is not an object's address (s3://bucket/key)")
    bucket, _, key = url[len(SCHEME) :].partition("/")
    return bucket, key


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    modified: datetime


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the AWS S3 endpoint"


def describe(error: BaseException, what: str, bucket: str, *, reading: bool = False) -> ObjectStoreError:
    """A boto3 error as one line naming what to fix."""
    from botocore import exceptions

    if isinstance(error, exceptions.NoCredentialsError | exceptions.PartialCredentialsError):
        return ObjectStoreError(
            f"{what}: no credentials for the object store: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(or another source the AWS SDKs read)"
        )
    if isinstance(error, exceptions.EndpointConnectionError | exceptions.ConnectTimeoutError):
        return ObjectStoreError(
            f"{what}: the object store at {_endpoint()} does not answer: start it or fix AWS_ENDPOINT_URL"
        )
    if isinstance(error, exceptions.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket" or (code == "404" and not reading):
            return ObjectStoreError(
                f"{what}: bucket {bucket!r} does not exist at {_endpoint()}: create it or fix KENNING_OBJECT_STORE"
            )
        if code in ("NoSuchKey", "404"):
            return ObjectStoreError(
                f"{what}: the object is missing from bucket {bucket!r} (deleted outside Kenning?): restore it "
                "from the bucket's versions or backups"
            )
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            return ObjectStoreError(
                f"{what}: the object store refused the credentials ({code}): fix AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY or bucket {bucket!r}'s policy"
            )
        return ObjectStoreError(f"{what}: the object store answered {code or 'an error'} for bucket {bucket!r}")
    if isinstance(error, exceptions.BotoCoreError):
        return ObjectStoreError(f"{what}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
    return ObjectStoreError(f"{what}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


_CLIENTS: dict[tuple[str, ...], Any] = {}
# what a boto3 client takes from the environment when it is made: a client is kept per
# their values, so one made before they change (a test's next server) is not reused
_CLIENT_VARIABLES = (
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_PROFILE",
)


def _client() -> Any:
    """One boto3 S3 client per process and environment (thread-safe), made on first use."""
    key = tuple(os.environ.get(name, "") for name in _CLIENT_VARIABLES)
    client = _CLIENTS.get(key)
    if client is None:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
        client = _CLIENTS[key] = boto3.session.Session().client("s3", config=config)
    return client


class ObjectStore:
    """The calls Kenning makes to one bucket; each raises ``ObjectStoreError``."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    def _call(self, what: str, method: str, **arguments: Any) -> Any:
        try:
            return getattr(_client(), method)(Bucket=self.bucket, **arguments)
        except Exception as error:
            described = describe(error, what, self.bucket, reading=method == "get_object")
            if "refused the credentials" in str(described) and method != "head_bucket":
                # some stores (SeaweedFS) refuse a write to a bucket that does not exist
                # as AccessDenied: the bucket's own answer tells which it is
                try:
                    self._call(what, "head_bucket")
                except ObjectStoreError as bucket_error:
                    if "does not exist" in str(bucket_error):
                        raise bucket_error from error
            raise described from error

    async def check(self) -> None:
        """Raise unless the bucket answers (a process's start: bad configuration said at once)."""
        await asyncio.to_thread(self._call, f"object store s3://{self.bucket}", "head_bucket")

    async def put(self, key: str, data: bytes) -> None:
        await asyncio.to_thread(self.put_now, key, data)

    def put_now(self, key: str, data: bytes) -> None:
        """``put`` in the caller's thread (the codec boundary, which is synchronous)."""
        self._call(f"writing s3://{self.bucket}/{key}", "put_object", Key=key, Body=data)

    async def get(self, key: str) -> bytearray:
        return await asyncio.to_thread(self.get_now, key)

    def get_now(self, key: str) -> bytearray:
        """The object's bytes, read from the response in pieces into one buffer (not copied
        into ``bytes``: the value's size once, not twice)."""
        what = f"reading s3://{self.bucket}/{key}"
        response = self._call(what, "get_object", Key=key)
        try:
            buffer = bytearray()
            for chunk in response["Body"].iter_chunks(CHUNK_BYTES):
                buffer += chunk
            return buffer
        except Exception as error:
            raise describe(error, what, self.bucket, reading=True) from error

    async def stream(self, key: str, *, limit: int | None = None) -> AsyncGenerator[bytes, None]:
        """The object's bytes in pieces of ``CHUNK_BYTES`` (the first ``limit`` only, if
        given): a download never holds the whole value."""
        what = f"reading s3://{self.bucket}/{key}"
        extra = {"Range": f"bytes=0-{limit - 1}"} if limit else {}
        response = await asyncio.to_thread(self._call, what, "get_object", Key=key, **extra)
        chunks: Iterator[bytes] = response["Body"].iter_chunks(CHUNK_BYTES)
        try:
            while True:
                try:
                    chunk = await asyncio.to_thread(next, chunks, b"")
                except Exception as error:
                    raise describe(error, what, self.bucket, reading=True) from error
                if not chunk:
                    return
                yield chunk
        finally:
            response["Body"].close()

    async def listed(self, prefix: str) -> list[StoredObject]:
        """Every object under ``prefix``, page by page."""

        def pages() -> list[StoredObject]:
            found: list[StoredObject] = []
            token: dict[str, str] = {}
            while True:
                page = self._call(f"listing s3://{self.bucket}/{prefix}", "list_objects_v2", Prefix=prefix, **token)
                found.extend(
                    StoredObject(item["Key"], int(item["Size"]), item["LastModified"])
                    for item in page.get("Contents", [])
                )
                if not page.get("IsTruncated"):
                    return found
                token = {"ContinuationToken": page["NextContinuationToken"]}

        return await asyncio.to_thread(pages)

    async def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + _DELETE_BATCH]]
            await asyncio.to_thread(
                self._call,
                f"deleting {len(batch)} objects from s3://{self.bucket}",
                "delete_objects",
                Delete={"Objects": batch, "Quiet": True},
            )
