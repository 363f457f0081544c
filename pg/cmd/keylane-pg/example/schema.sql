-- The shop of keylane-pg's example (shop.json): a SKU's stock, never
-- below zero, and one order row per unit sold, under the caller's order
-- ID (the job's ID).
CREATE TABLE IF NOT EXISTS stock (
	sku text PRIMARY KEY,
	n bigint NOT NULL CHECK (n >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
	order_id text PRIMARY KEY,
	sku text NOT NULL,
	qty bigint NOT NULL CHECK (qty > 0),
	at timestamptz NOT NULL DEFAULT now()
);
