// Package sqlfile makes a keylanepg handler of a file of SQL statements,
// so that jobs apply to PostgreSQL with no Go code: a job's type names
// its statements, its payload's JSON fields bind to their parameters, and
// its result is the rows they return, as JSON. Command keylane-pg
// (pg/cmd/keylane-pg) runs a worker with one.
//
// # The file
//
// A JSON object (JSON, so that the standard library reads it and keylane's
// modules need nothing more), with one key, "jobs", mapping each job type
// to its statements:
//
//	{
//	  "jobs": {
//	    "buy-one": {
//	      "fields": ["qty"],
//	      "statements": [
//	        [
//	          "WITH u AS (UPDATE stock SET n = n - :qty WHERE sku = :job.key AND n >= :qty RETURNING n),",
//	          "o AS (INSERT INTO orders (order_id, sku, qty) SELECT :job.id, :job.key, :qty FROM u)",
//	          "SELECT EXISTS (SELECT FROM u) AS sold,",
//	          "  coalesce((SELECT n FROM u), (SELECT n FROM stock WHERE sku = :job.key), 0) AS left"
//	        ]
//	      ],
//	      "result": "row"
//	    },
//	    "stock": {
//	      "statements": ["SELECT n FROM stock WHERE sku = :job.key"],
//	      "result": "row"
//	    }
//	  }
//	}
//
// A job type's keys:
//
//   - "fields": the names of the payload's fields (letters, digits, _).
//     Every one must be in the payload (null is SQL's NULL), and the
//     payload may have no other: a job that lacks one, has another, or
//     whose payload is not a JSON object fails for good
//     (keylane.Permanent) with an error naming them. A type without
//     fields takes an empty payload, or {}.
//   - "statements": one or more SQL statements (each a string, or an
//     array of strings, its lines), run in order in the
//     group's transaction (keylanepg's: never BEGIN, COMMIT, ROLLBACK,
//     SAVEPOINT, RELEASE or PREPARE; one statement a string). Parameters
//     are named: :qty binds the payload's field qty, :job.id the job's
//     ID (an order ID, when the caller gives one: keylane's idempotency
//     key) and :job.key its key. PostgreSQL's $1 is refused; :: is a
//     cast, and nothing inside quotes, dollar quotes or comments is a
//     parameter. A statement cannot read another's result in Go: chain
//     them in SQL (a data-modifying WITH, as "buy" above).
//   - "result": how the job's result is made of its last statement's
//     rows, each a JSON object of its columns: "rows" (the default) a JSON
//     array of them; "row" the one row, or null for none (more than one
//     fails the job for good); "none" null.
//   - "set": true runs the type's statements once for all its jobs that
//     come one after another in a transaction, instead of once a job (see
//     "Sets").
//
// A field's value goes to the server as text, which it parses as the
// parameter's type: a string's contents, a number's or a boolean's
// literal, an object's or an array's JSON (for a json or jsonb
// parameter). A value that does not parse, a number out of range, a
// constraint broken (SQLSTATE classes 22 and 23) fails the job for good:
// the server answers the same on every try. A column's value comes back
// as JSON: numbers (numeric too) and booleans as such, json and jsonb as
// themselves, uuid, date and timestamps as strings, bytea in base64, any
// other type as its text.
//
// # Checks at start
//
// Parse checks the file alone: the JSON's keys, fields, statements and
// their parameters (an unknown parameter, a field that no statement
// binds, a positional one, a transaction statement) and result. Check
// prepares every statement against the database, in a transaction it
// rolls back (nothing runs): a syntax error, an unknown table or column,
// a parameter whose type the server cannot infer (cast it: :qty::bigint),
// a result statement that returns no columns or one name twice. Each
// fault names its job type and statement; all of them are reported at
// once, with ErrInvalid.
//
// # Sets
//
// A set type's statements run once for a run of its jobs (those that come
// one after another in the transaction's order; another type's job ends
// the run, so every key's jobs still apply in order), with every
// parameter an array of the jobs' values in that order: :qty is a
// text-typed array the statement casts and unnests, with :job.id and
// :job.key beside it. The result statement returns rows that each name
// their job in a column job_id (its :job.id element): a job's result is
// made of its rows (job_id is left out of them, so the result is the same
// as a plain type's). Such a statement sees the jobs of one key together:
// it must fold them in their order itself (WITH ORDINALITY; a running
// sum), as keylanepg's SetHandler does in Go. The example's set sale
// (pg/cmd/keylane-pg/example/shop.json, type "buy"; a statement's lines
// may be given as an array of strings):
//
//	WITH req AS (
//	  SELECT * FROM unnest(:job.id::text[], :job.key::text[], :qty::bigint[])
//	    WITH ORDINALITY AS r(job_id, sku, qty, ord)),
//	s AS (SELECT sku, n FROM stock WHERE sku IN (SELECT sku FROM req) FOR UPDATE),
//	run AS (
//	  SELECT req.*, coalesce(s.n, 0) AS stock,
//	    sum(req.qty) OVER (PARTITION BY req.sku ORDER BY req.ord) AS upto
//	  FROM req LEFT JOIN s USING (sku)),
//	sold AS (SELECT * FROM run WHERE upto <= stock),
//	u AS (UPDATE stock SET n = stock.n - t.qty
//	  FROM (SELECT sku, sum(qty) AS qty FROM sold GROUP BY sku) t WHERE stock.sku = t.sku),
//	o AS (INSERT INTO orders (order_id, sku, qty) SELECT job_id, sku, qty FROM sold)
//	SELECT job_id, upto <= stock AS sold,
//	  CASE WHEN upto <= stock THEN stock - upto
//	    ELSE stock - coalesce((SELECT max(upto) FROM sold WHERE sold.sku = run.sku), 0) END AS left
//	FROM run
//
// A SKU's purchases sell while their running sum fits its stock: with
// one unit each, what type "buy-one" does a statement a purchase
// (TestSetMatchesOneByOne holds the two to the same answers and rows). If a set's
// statement fails, keylanepg's careful path applies the transaction's
// jobs one at a time, each a set of one, so that the failing job fails
// alone (see "Set handlers" in package keylanepg).
//
// # How it runs
//
// A File is a keylanepg.SetHandler: Read queues every job's statements
// (a plain type's once per job, a set type's once per run), in the
// jobs' order, and reads their rows as they come; the Write it returns
// queues nothing and returns each job's result. A transaction of a
// group's jobs is then two round trips on a *pgxpool.Pool, with
// keylanepg's fence, exactly-once record and careful path unchanged.
package sqlfile
