-- Every run_id compares bytewise (COLLATE "C"), as oncewire_runs.run_id always did and as on
-- SQLite. With the database's default collation on the other tables, a join or a lookup that
-- took its run_id from oncewire_runs compared under "C" and could not use those tables'
-- (run_id, ...) indexes: each command on a run read its whole event index, so commands on a
-- long run slowed down with every event. The indexes are rebuilt with their columns.
ALTER TABLE oncewire_run_key_pins ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE oncewire_run_events ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE oncewire_run_phases ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE oncewire_run_findings ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE oncewire_run_actions ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE oncewire_run_deliveries ALTER COLUMN run_id TYPE TEXT COLLATE "C";
ALTER TABLE oncewire_run_reports ALTER COLUMN run_id TYPE TEXT COLLATE "C";
