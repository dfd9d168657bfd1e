-- Idempotent receipts (oncewire_receipts), written once for every dialect.

-- name: reserve_receipt
-- Reserve the key; nothing inserted (rowcount 0) when a receipt is already stored under it.
INSERT INTO oncewire_receipts (key, digest, payload, created_at, expires_at)
VALUES (:key, :digest, :payload, :now, :expires_at)
ON CONFLICT (key) DO NOTHING

-- name: complete_receipt
UPDATE oncewire_receipts SET result = :result WHERE key = :key

-- name: get_receipt
SELECT {receipt_columns} FROM oncewire_receipts WHERE key = :key

-- name: list_receipts
SELECT {receipt_columns} FROM oncewire_receipts WHERE key > :after_key ORDER BY key LIMIT :limit

-- name: purge_receipts
-- Operator-only: receipts whose retention ended.
DELETE FROM oncewire_receipts WHERE expires_at IS NOT NULL AND expires_at < :expired_before
