"""The S3-compatible cold store (boto3): any service speaking the S3 API (AWS, MinIO, Ceph,
the test harness's moto server). Credentials come from the 0600 file the configuration names,
else from boto3's default chain; they never appear in messages."""

from __future__ import annotations

from typing import Any

from ..errors import NotFoundError
from .config import ColdStorageConfig
from .store import ColdStoreError, check_key


class S3Store:
    def __init__(self, config: ColdStorageConfig, client: Any | None = None) -> None:
        self.config = config
        self.bucket = config.bucket
        self.prefix = config.prefix
        self._client = client

    def describe(self) -> str:
        return self.config.describe()

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise ColdStoreError(
                    f"cold store {self.describe()} needs boto3, which is not installed", hint="pip install 'dlctl[s3]'"
                ) from None

            creds = self.config.credentials()
            kwargs: dict[str, Any] = {}
            if creds is not None:
                kwargs = {"aws_access_key_id": creds[0], "aws_secret_access_key": creds[1]}
            self._client = boto3.client(
                "s3",
                endpoint_url=self.config.endpoint,
                region_name=self.config.region or "us-east-1",
                config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=30),
                **kwargs,
            )
        return self._client

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFoundError(f"cold store {self.describe()} has no object {kwargs.get('Key', '')}") from None
            raise ColdStoreError(f"cold store {self.describe()}: {what}: {code or exc}") from None
        except BotoCoreError as exc:
            raise ColdStoreError(f"cold store {self.describe()}: {what}: {exc}", hint="check [cold_storage] endpoint and the network") from None

    def put(self, key: str, data: bytes) -> None:
        self._call(f"writing {key}", self.client.put_object, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        return self._call(f"reading {key}", self.client.get_object, Key=self._key(key))["Body"].read()

    def exists(self, key: str) -> bool:
        try:
            self._call(f"looking up {key}", self.client.head_object, Key=self._key(key))
        except NotFoundError:
            return False
        return True

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix) + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(f"listing {prefix}", self.client.list_objects_v2, **kwargs)
            keys += [item["Key"][strip:] for item in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(keys)
            token = page.get("NextContinuationToken")

    def delete(self, key: str) -> None:
        self._call(f"deleting {key}", self.client.delete_object, Key=self._key(key))
