-- The W3C traceparent of the span current when the effect was accepted (NULL: none, or nobody
-- listening), so that its attempts continue the accepting trace (oncewire.otel).
ALTER TABLE oncewire_effects ADD COLUMN traceparent TEXT;
