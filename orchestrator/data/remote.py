"""Remote (s3://) MDS datasets: one readable check before mosaic opens them, and one-line
messages for shards that cannot be fetched.

Why a check of our own: mosaic (streaming 0.13) reports every S3 failure on index.json or
a shard the same way, "Object s3://... not found! Either check the bucket path or the
bucket permission", whether the bucket is missing, the prefix is wrong or the keys are
refused, one dataset at a time and after its retries. `check_remote_datasets` asks S3
once per dataset, with a client built the way mosaic builds its own, and raises one
error naming every dataset that would fail, why, and what to change.

Credentials: the boto3 default chain, exactly as mosaic (environment variables,
AWS_PROFILE / config files, instance or container roles); the endpoint: S3_ENDPOINT_URL,
the variable mosaic passes as `endpoint_url`. Values of credentials never appear in a
message: names of variables do, and every message is scrubbed of the values in use.

boto3/botocore are imported inside functions: this module is importable on the submit
side, which does not need them.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any, List, Optional, Sequence, Tuple

ENDPOINT_VAR = "S3_ENDPOINT_URL"  # read by mosaic's S3Downloader (streaming/base/storage/download.py)
CREDENTIAL_VARS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (plus AWS_SESSION_TOKEN for temporary keys)"
_SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")

# S3 error codes (body of a GET error reply) -> (cause, fix). HEAD replies carry no body,
# hence the probe below is a one-byte GET.
_BUCKET_MISSING = ("NoSuchBucket",)
_KEY_MISSING = ("NoSuchKey", "404")
_REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "TokenRefreshRequired",
            "InvalidClientTokenId", "AuthorizationHeaderMalformed")
_DENIED = ("AccessDenied", "AllAccessDisabled")


class RemoteDataError(RuntimeError):
    """Remote datasets that cannot be read; `failures` holds (name, uri, cause) for each."""

    def __init__(self, message: str, failures: Sequence[Tuple[str, str, str]] = ()):
        super().__init__(message)
        self.failures = list(failures)


def _split_s3(uri: str) -> Tuple[str, str]:
    parsed = urllib.parse.urlparse(uri)
    return parsed.netloc, parsed.path.strip("/")


def _index_key(prefix: str) -> str:
    # mosaic joins remote, split ("") and "index.json" with os.path.join.
    return f"{prefix}/index.json" if prefix else "index.json"


def endpoint_description() -> str:
    """The endpoint mosaic will use, without any user:password part of the URL."""
    url = os.environ.get(ENDPOINT_VAR)
    if not url:
        return f"AWS default ({ENDPOINT_VAR} not set)"
    parsed = urllib.parse.urlparse(url)
    if parsed.username or parsed.password:
        parsed = parsed._replace(netloc=parsed.hostname + (f":{parsed.port}" if parsed.port else ""))
    return f"{parsed.geturl()} ({ENDPOINT_VAR})"


def _secrets(session: Any = None) -> List[str]:
    values = [os.environ.get(v, "") for v in _SECRET_VARS]
    if session is not None:
        try:
            creds = session.get_credentials()
            if creds is not None:
                frozen = creds.get_frozen_credentials()
                values += [frozen.access_key or "", frozen.secret_key or "", frozen.token or ""]
        except Exception:  # resolving credentials is what may fail here; nothing to scrub then
            pass
    return [v for v in values if len(v) >= 4]


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for value in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(value, "***")
    return text


def _credential_source(session: Any) -> str:
    """Where boto3 found credentials ('environment variables', 'shared credentials file'...),
    or '' when it found none. Names a source, never a value."""
    try:
        creds = session.get_credentials()
    except Exception:
        return ""
    if creds is None:
        return ""
    method = getattr(creds, "method", "") or "unknown source"
    return {"env": "environment variables", "shared-credentials-file": "shared credentials file",
            "config-file": "AWS config file", "iam-role": "instance role (EC2 metadata)",
            "container-role": "container role", "assume-role": "assumed role"}.get(method, method)


def _cause_of(err: BaseException, bucket: str, uri: str, cred_source: str) -> Tuple[str, str]:
    """(cause, fix) in words for an S3 failure on `uri`."""
    from botocore.exceptions import ClientError, ConnectionClosedError, NoCredentialsError, ReadTimeoutError
    from botocore.exceptions import ConnectionError as BotoConnectionError  # refused, DNS, connect timeout, TLS

    if isinstance(err, NoCredentialsError):
        return ("no credentials found",
                f"set {CREDENTIAL_VARS}, or AWS_PROFILE, in the job's environment")
    if isinstance(err, BotoConnectionError):
        return (f"endpoint unreachable ({type(err).__name__})",
                f"check {ENDPOINT_VAR} (host, port, http/https) and that the job's nodes can reach it")
    if isinstance(err, ConnectionClosedError):
        return ("the endpoint closed the connection before replying",
                "check the endpoint's health, proxies and load balancers between the job and it")
    if isinstance(err, ReadTimeoutError):
        return ("endpoint did not answer in time (read timeout)", "check the endpoint's health and the network")
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = str(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
        if code in _BUCKET_MISSING:
            return (f"bucket {bucket!r} does not exist",
                    f"correct the bucket name in the path, or point {ENDPOINT_VAR} at the storage that holds it")
        if code in _KEY_MISSING:
            return ("index.json missing: not an MDS dataset or wrong prefix",
                    "the path must be the directory that holds index.json and the shards (as written by MDSWriter)")
        if code in _REFUSED:
            source = f" from {cred_source}" if cred_source else ""
            return (f"credentials refused ({code}): the endpoint does not accept the keys{source}",
                    f"set {CREDENTIAL_VARS}, or AWS_PROFILE, to keys valid for {endpoint_description()}")
        if code == "403":  # a HEAD reply (s3transfer starts every download with one): no error code
            return ("access denied or credentials refused (HTTP 403)",
                    f"check {CREDENTIAL_VARS}, or AWS_PROFILE, and that those keys may read this bucket and prefix")
        if code in _DENIED or status == "403":
            return (f"access denied ({code or status})",
                    f"grant s3:GetObject (and s3:ListBucket, or S3 answers 'denied' for missing objects too) on "
                    f"this bucket and prefix to the credentials in use, or set {CREDENTIAL_VARS} to keys that have it")
        return (f"S3 error {code or status}: {error.get('Message', '')}".strip(), "see the S3 error code")
    return (f"{type(err).__name__}: {err}", "")


def check_remote_datasets(datasets: Sequence[Any]) -> None:
    """Raise one RemoteDataError naming every s3:// dataset whose index.json cannot be read.

    `datasets`: objects with `.name` and `.path`; paths not starting with s3:// are skipped
    (local ones are checked elsewhere, other schemes are left to mosaic)."""
    remote = [d for d in datasets if str(d.path).startswith("s3://")]
    if not remote:
        return
    import boto3
    from botocore.config import Config

    # As mosaic's S3Downloader._create_s3_client: default session (default credential chain),
    # endpoint from S3_ENDPOINT_URL, adaptive retries, mosaic's 60 s read timeout. The connect
    # timeout is shorter than botocore's 60 s so a wrong endpoint is reported in seconds.
    session = boto3.session.Session()
    client = session.client("s3", endpoint_url=os.environ.get(ENDPOINT_VAR) or None,
                            config=Config(connect_timeout=10, read_timeout=60, retries={"mode": "adaptive"}))
    requester_pays = {b.strip() for b in os.environ.get("MOSAICML_STREAMING_AWS_REQUESTER_PAYS", "").split(",")}
    cred_source = _credential_source(session)
    secrets = _secrets(session)
    failures: List[Tuple[str, str, str]] = []
    lines: List[str] = []
    for d in remote:
        uri = str(d.path).rstrip("/")
        bucket, prefix = _split_s3(uri)
        if not bucket:
            failures.append((d.name, uri, "no bucket in the URI"))
            lines.append(f"  - dataset {d.name!r}: {uri}: no bucket in the URI. Fix: write s3://<bucket>/<prefix>")
            continue
        extra = {"RequestPayer": "requester"} if bucket in requester_pays else {}
        try:
            # A one-byte GET rather than a HEAD: S3 answers a HEAD with a bare 403/404 (no
            # body), a GET with its error code, which tells a missing bucket from a missing
            # index and refused keys from missing permissions.
            client.get_object(Bucket=bucket, Key=_index_key(prefix), Range="bytes=0-0", **extra)["Body"].close()
        except Exception as err:  # every failure is reported below, none is raised on its own
            cause, fix = (_scrub(text, secrets) for text in _cause_of(err, bucket, uri, cred_source))
            failures.append((d.name, uri, cause))
            lines.append(f"  - dataset {d.name!r}: {uri}/index.json: {cause}." + (f" Fix: {fix}." if fix else ""))
    if failures:
        head = (f"{len(failures)} of {len(remote)} remote dataset(s) cannot be read "
                f"(endpoint: {endpoint_description()}):")
        raise RemoteDataError(_scrub("\n".join([head, *lines]), secrets), failures)


def describe_download_error(dataset_name: str, shard_uri: str, err: BaseException) -> str:
    """One line for a shard that mosaic could not fetch after its retries."""
    from botocore.exceptions import BotoCoreError, ClientError

    # mosaic re-raises botocore's exception (its message rewritten to "Object ... not
    # found!" for 403/404) or wraps it; the botocore one carries the real cause.
    found: Optional[BaseException] = None
    seen, cur = set(), err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, (ClientError, BotoCoreError)):
            found = cur
            break
        cur = cur.__cause__ or cur.__context__
    bucket, _ = _split_s3(shard_uri) if shard_uri.startswith("s3://") else ("", "")
    if found is None:
        cause = f"{type(err).__name__}: {err}"
    else:
        cause, _ = _cause_of(found, bucket, shard_uri, "")
        if cause.startswith("index.json missing"):
            cause = "object missing (index.json lists it; upload the shard again or rewrite the dataset)"
    line = (f"dataset {dataset_name}: shard {shard_uri} could not be downloaded after retries: {cause} "
            f"(endpoint: {endpoint_description()})")
    return _scrub(" ".join(line.split()), _secrets())
