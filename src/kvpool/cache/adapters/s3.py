"""`s3`: an S3 bucket (AWS, MinIO, Ceph RGW, moto) through boto3, one object per key.

    {"type": "s3", "bucket": "kv", "endpoint_url": "http://127.0.0.1:9000", "prefix": "kvpool/",
     "region": "us-east-1", "access_key_id": "...", "secret_access_key": "..."}

The keys of one task go out in parallel (`concurrency` requests in flight across all tasks):
S3 is latency-bound, so one-after-another would cost a round trip per key. PUT replaces an
object atomically (readers see the old or the new object, never a part), so no
temp-and-rename is needed. Missing credentials fall back to boto3's usual chain (environment,
profile, instance role). The boto3 client is thread-safe and its connection pool is sized to
`concurrency`; connect and read timeouts bound every call, so `close()` never waits on
an unreachable endpoint for longer than them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvpool.cache.adapters.registry import AdapterConfig, register_adapter
from kvpool.cache.adapters.threaded import Backend, Record, ThreadedAdapter
from kvpool.cache.keys import ObjectKey
from kvpool.errors import InvalidParams

__all__ = ["S3AdapterConfig", "S3Backend", "create_s3_adapter"]

_MISSING = {"404", "NoSuchKey", "NotFound"}


@dataclass(frozen=True)
class S3AdapterConfig(AdapterConfig):
    bucket: str = ""
    endpoint_url: str = ""
    """Empty: AWS itself."""
    region: str = "us-east-1"
    access_key_id: str = ""
    secret_access_key: str = ""
    prefix: str = "kvpool/"
    """Prefix of every object key this adapter writes."""
    create_bucket: bool = False
    """Create the bucket at start if it does not exist (tests, MinIO)."""
    workers: int = 8
    """Tasks worked on at once."""
    concurrency: int = 16
    """Requests in flight across all tasks: S3 is latency-bound, so the keys of one task go out
    in parallel instead of one after another."""
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.bucket, str) or not self.bucket:
            raise InvalidParams(f's3 adapter needs "bucket", got {self.bucket!r}')
        if (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or not 1 <= self.concurrency <= 256
        ):
            raise InvalidParams(
                f"s3.concurrency must be an int in [1, 256], got {self.concurrency!r}"
            )
        if not isinstance(self.timeout_s, int | float) or self.timeout_s <= 0:
            raise InvalidParams(f"s3.timeout_s must be > 0, got {self.timeout_s!r}")


class S3Backend(Backend):
    def __init__(self, config: S3AdapterConfig) -> None:
        import boto3
        from botocore.config import Config

        kwargs: dict[str, Any] = {
            "region_name": config.region,
            "config": Config(
                max_pool_connections=config.concurrency + 2,
                connect_timeout=config.timeout_s,
                read_timeout=config.timeout_s,
                retries={"max_attempts": 2, "mode": "standard"},
            ),
        }
        if config.endpoint_url:
            kwargs["endpoint_url"] = config.endpoint_url
        if config.access_key_id:
            kwargs["aws_access_key_id"] = config.access_key_id
            kwargs["aws_secret_access_key"] = config.secret_access_key
        self._client: Any = boto3.client("s3", **kwargs)
        self._bucket = config.bucket
        self._prefix = config.prefix
        self._io = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="kvpool-l2-s3-io"
        )
        if config.create_bucket:
            try:
                with contextlib.suppress(self._client.exceptions.BucketAlreadyOwnedByYou):
                    self._client.create_bucket(Bucket=self._bucket)
            except BaseException:
                self._io.shutdown(wait=False)
                self._client.close()
                raise

    def _name(self, key: ObjectKey) -> str:
        return self._prefix + key.to_string()

    @staticmethod
    def _is_missing(exc: Exception) -> bool:
        from botocore.exceptions import ClientError

        return (
            isinstance(exc, ClientError)
            and str(exc.response.get("Error", {}).get("Code")) in _MISSING
        )

    def _put(self, key: ObjectKey, record: Record) -> None:
        head, payload = record
        self._client.put_object(
            Bucket=self._bucket, Key=self._name(key), Body=b"".join((head, payload))
        )

    def _get(self, key: ObjectKey) -> bytes | None:
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=self._name(key))
        except Exception as exc:
            if self._is_missing(exc):
                return None
            raise
        body = resp["Body"]
        try:
            data: bytes = body.read()
            return data
        finally:
            body.close()

    def _exists(self, key: ObjectKey) -> bool:
        try:
            self._client.head_object(Bucket=self._bucket, Key=self._name(key))
            return True
        except Exception as exc:
            if not self._is_missing(exc):
                raise
            return False

    def put_many(self, items: Sequence[tuple[ObjectKey, Record]]) -> None:
        list(self._io.map(lambda item: self._put(*item), items))

    def get_many(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        return list(self._io.map(self._get, keys))

    def exists_many(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return list(self._io.map(self._exists, keys))

    def delete_many(self, keys: Sequence[ObjectKey]) -> None:
        names = [self._name(k) for k in keys]
        for i in range(0, len(names), 1000):  # DeleteObjects takes at most 1000 keys
            self._client.delete_objects(
                Bucket=self._bucket,
                Delete={"Objects": [{"Key": n} for n in names[i : i + 1000]], "Quiet": True},
            )

    def close(self) -> None:
        self._io.shutdown(wait=True, cancel_futures=True)
        self._client.close()


def create_s3_adapter(config: S3AdapterConfig) -> ThreadedAdapter:
    return ThreadedAdapter(S3Backend(config), name="s3", workers=config.workers)


register_adapter("s3", S3AdapterConfig, create_s3_adapter)
