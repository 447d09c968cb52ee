"""The published Stryker report schema, for tests: fetched once from npm, then cached."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

# The npm package that publishes the report schema. Its own version is not the
# schema's: 3.x publishes schemaVersion "2". Pins from the registry's dist fields.
SCHEMA_PACKAGE = "mutation-testing-report-schema"
SCHEMA_PACKAGE_VERSION = "3.8.4"
SCHEMA_SHASUM = "d02941338340c932f4222f68edded6f75b6f929f"
SCHEMA_INTEGRITY = (
    "sha512-s4G71R6Lt/PpZ0cqeglIcgyBdzLM8E+SeCHZAPg1wkSsPt"
    "RBa4XfPzAozYKdiJk/TLbNEEb7En9t0/bveuPuxA=="
)
SCHEMA_TARBALL = (
    f"https://registry.npmjs.org/{SCHEMA_PACKAGE}/-/{SCHEMA_PACKAGE}-{SCHEMA_PACKAGE_VERSION}.tgz"
)
SCHEMA_MEMBER = "package/dist/src/mutation-testing-report-schema.json"


def _matches_pins(data: bytes) -> bool:
    sha512 = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    return hashlib.sha1(data).hexdigest() == SCHEMA_SHASUM and sha512 == SCHEMA_INTEGRITY


def published_schema(cache_dir: Path, url: str = SCHEMA_TARBALL) -> dict[str, Any]:
    """The schema from the pinned npm tarball: downloaded once, then read from the cache."""
    tarball = cache_dir / f"{SCHEMA_PACKAGE}-{SCHEMA_PACKAGE_VERSION}.tgz"
    data = tarball.read_bytes() if tarball.is_file() else b""
    if not _matches_pins(data):
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                data = response.read()
        except OSError as exc:
            pytest.skip(
                f"the Stryker report schema is not cached at {tarball} and the npm registry "
                f"is unreachable ({exc}); run once with network to cache it"
            )
        if not _matches_pins(data):
            pytest.fail(f"{url} does not match the pinned shasum/integrity; not cached")
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".part")
        partial.write_bytes(data)
        partial.replace(tarball)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile(SCHEMA_MEMBER)
        assert member is not None
        schema: dict[str, Any] = json.load(member)
    return schema
