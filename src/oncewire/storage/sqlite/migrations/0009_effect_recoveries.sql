-- started_fence: the fence of the last claim whose sink call was recorded as starting (0: none).
-- A claim released after its owner died counts as an attempt only when started_fence equals its
-- fence; a claim whose sink was never called goes back unflagged and uncharged.
-- recoveries: how many times an owner died (or lost its lease) while the effect's sink ran,
-- bounded apart from max_attempts. An effect with recoveries is claimed alone.
ALTER TABLE oncewire_effects ADD COLUMN started_fence INTEGER NOT NULL DEFAULT 0
    CHECK (started_fence >= 0);
ALTER TABLE oncewire_effects ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0
    CHECK (recoveries >= 0);

-- What a dispatcher looks at first: waiting effects an owner died on, in due order.
CREATE INDEX oncewire_effects_suspects ON oncewire_effects (not_before, id)
    WHERE state IN ('pending', 'uncertain') AND recoveries > 0;

-- A claim taken before this migration was called at once: its sink may have started.
UPDATE oncewire_effects SET started_fence = fence WHERE state = 'claimed';
