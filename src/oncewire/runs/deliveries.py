"""Completion deliveries: the final message and its artifact manifest, committed together.

``commit`` writes the message text, the manifest (artifact ids, versions, sizes and sha256 of
their bytes) and their digests in one row; ``publish`` marks it published afterwards. If a
crash leaves a delivery committed, reconciliation settles it at boot: it is published once with
a review status that says what is known (an unreviewed candidate becomes
``review_unavailable``) and a recovery note. Recovery never changes the message or the manifest
(the schema refuses it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, digest
from oncewire.core.errors import ConfigurationError, RunConflict, RunNotFound, TransitionRefused
from oncewire.core.ids import new_id
from oncewire.runs.append import RunContext
from oncewire.runs.records import CompletionDelivery
from oncewire.storage.runs import DeliveryRow

__all__ = ["Deliveries", "artifact_manifest", "delivery"]

DEFAULT_DELIVERY_LEASE_SECONDS = 60.0

DELIVERY_AFTER_COMMIT = crash.register(
    "runs.delivery_after_commit", "a delivery is committed; it has not been published"
)


def artifact_manifest(versions: Iterable[tuple[str, str, str, bytes]]) -> dict[str, Any]:
    """A manifest of ``(artifact_id, version_id, name, data)``: what the message refers to."""
    return {
        "schema_version": 1,
        "artifacts": [
            {
                "artifact_id": artifact_id,
                "version_id": version_id,
                "name": name,
                "size_bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            for artifact_id, version_id, name, data in versions
        ],
    }


def delivery(row: DeliveryRow) -> CompletionDelivery:
    return CompletionDelivery(
        delivery_id=row.delivery_id,
        key=row.idempotency_key,
        scope=row.scope,
        branch=row.branch,
        turn=row.turn,
        run_id=row.run_id,
        content=row.content,
        content_sha256=row.content_sha256,
        manifest=json.loads(row.manifest_json),
        manifest_sha256=row.manifest_sha256,
        review_status=row.review_status,
        status=row.status,
        recovery=None if row.recovery_json is None else json.loads(row.recovery_json),
        created_at=row.created_at,
        published_at=row.published_at,
    )


class Deliveries:
    """Completion deliveries of the run ledger: ``ledger.runs.deliveries``."""

    def __init__(self, context: RunContext) -> None:
        self._ctx = context

    def commit(
        self,
        key: str,
        *,
        scope: str,
        content: str,
        manifest: dict[str, Any],
        branch: str | None = None,
        turn: str | None = None,
        run_id: str | None = None,
        review_status: str = "candidate",
        expected_manifest_sha256: str | None = None,
        owner: str | None = None,
        lease_seconds: float = DEFAULT_DELIVERY_LEASE_SECONDS,
    ) -> CompletionDelivery:
        """Commit the message and its manifest together (the same key again is a replay)."""
        if not isinstance(content, str):
            raise ConfigurationError("a delivery's content is text")
        manifest_json = canonical_json(manifest)
        manifest_sha256 = hashlib.sha256(manifest_json.encode()).hexdigest()
        if expected_manifest_sha256 is not None and expected_manifest_sha256 != manifest_sha256:
            raise TransitionRefused(
                "the manifest is not the one the caller built (its sha256 differs)"
            )
        request = {
            "scope": scope,
            "branch": branch or scope,
            "turn": turn,
            "run_id": run_id,
            "content": content,
            "manifest_sha256": manifest_sha256,
            "review_status": review_status,
        }
        request_digest = digest(request)
        now = self._ctx.now()
        row = DeliveryRow(
            delivery_id=new_id(),
            idempotency_key=key,
            request_digest=request_digest,
            scope=scope,
            branch=branch or scope,
            turn=turn,
            run_id=run_id,
            content=content,
            content_sha256=hashlib.sha256(content.encode()).hexdigest(),
            manifest_json=manifest_json,
            manifest_sha256=manifest_sha256,
            review_status=review_status,
            status="committed",
            recovery_json=None,
            owner=owner,
            lease_expires_at=now + lease_seconds,
            created_at=now,
            published_at=None,
        )
        with self._ctx.store.transaction() as tx:
            stored = self._ctx.store.insert_delivery_in_tx(tx, row)
        if stored.request_digest != request_digest:
            raise RunConflict(
                f"delivery key {key!r} is bound to another message; nothing was written",
                key=key,
            )
        DELIVERY_AFTER_COMMIT.hit()
        return delivery(stored)

    def publish(self, delivery_id: str) -> CompletionDelivery:
        """Mark a committed delivery published (a published one is returned unchanged)."""
        now = self._ctx.now()
        with self._ctx.store.transaction() as tx:
            row = self._ctx.store.get_delivery_in_tx(tx, delivery_id)
            if row is None:
                raise RunNotFound(f"no delivery {delivery_id!r}")
            if row.status == "committed":
                self._ctx.store.settle_delivery_in_tx(
                    tx,
                    delivery_id,
                    review_status=row.review_status,
                    recovery_json=row.recovery_json,
                    published_at=now,
                )
        return self.get(delivery_id)

    def get(self, delivery_id: str) -> CompletionDelivery:
        row = self._ctx.store.get_delivery(delivery_id)
        if row is None:
            raise RunNotFound(f"no delivery {delivery_id!r}")
        return delivery(row)
