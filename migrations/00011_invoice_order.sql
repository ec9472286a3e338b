-- +goose Up
-- The payment hold follows the newest invoice: invoice events are ordered by their invoice's
-- creation first and by the event only within one invoice, so a late payment of an older invoice
-- can neither lift a newer invoice's hold nor, applied first, make that newer failure look stale.
ALTER TABLE subscriptions ADD COLUMN inv_invoice_created timestamptz;
UPDATE subscriptions s SET inv_invoice_created = i.created
  FROM invoices i
  WHERE i.invoice_id = s.latest_invoice_id AND s.inv_event_id IS NOT NULL;

-- +goose Down
ALTER TABLE subscriptions DROP COLUMN inv_invoice_created;
