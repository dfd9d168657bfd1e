-- Named leases (oncewire_leases), written once for every dialect. A lease changes holder only
-- under its row's lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: FOR UPDATE) and by compare and set
-- on its fence, so two processes racing for one name never both hold it.

-- name: insert_lease
-- The first holder of a name, under fence 1; nothing inserted (rowcount 0) when the row exists.
INSERT INTO oncewire_leases (name, owner, fence, expires_at, updated_at)
VALUES (:name, :owner, 1, :expires_at, :now)
ON CONFLICT (name) DO NOTHING

-- name: lease_for_update
-- The row an acquisition decides on, locked until its transaction ends.
SELECT name, owner, fence, expires_at, updated_at FROM oncewire_leases WHERE name = :name
{for_update}

-- name: take_lease
-- A new holder under the next fence, only if nobody moved the fence since it was read.
UPDATE oncewire_leases
   SET owner = :owner, fence = fence + 1, expires_at = :expires_at, updated_at = :now
 WHERE name = :name AND fence = :fence

-- name: extend_lease
-- The holder keeps its lease (same fence) for longer; refused (rowcount 0) once it moved.
UPDATE oncewire_leases SET expires_at = :expires_at, updated_at = :now
 WHERE name = :name AND owner = :owner AND fence = :fence

-- name: release_lease
-- The holder gives its lease back: no owner, the fence kept (the next holder takes fence + 1).
UPDATE oncewire_leases SET owner = NULL, expires_at = :now, updated_at = :now
 WHERE name = :name AND owner = :owner AND fence = :fence

-- name: get_lease
SELECT name, owner, fence, expires_at, updated_at FROM oncewire_leases WHERE name = :name
