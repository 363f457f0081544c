package sqlfile_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/pgtest"
	"github.com/keylane/keylane/pg/sqlfile"
)

const example = "../cmd/keylane-pg/example/"

// startShop starts a real PostgreSQL with keylane's tables and the
// example's, and returns a pool and the example file, checked.
func startShop(t *testing.T) (*pgxpool.Pool, *sqlfile.File) {
	t.Helper()
	s := pgtest.Start(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := keylanepg.Ensure(ctx, pool); err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(example + "schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, string(schema)); err != nil {
		t.Fatal(err)
	}
	f, err := sqlfile.Load(example + "shop.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Check(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool, f
}

func job(id, typ, key, payload string) keylane.Job {
	return keylane.Job{ID: id, Type: typ, Key: key, Payload: []byte(payload)}
}

var fence uint64

// apply applies jobs as one group (the next fence of partition 0) and
// returns each job's outcome.
func apply(t *testing.T, pool *pgxpool.Pool, f *sqlfile.File, jobs ...keylane.Job) []keylanepg.Outcome {
	t.Helper()
	fence++
	out, err := keylanepg.ApplySet(context.Background(), pool, keylanepg.Group{Namespace: "t", Partition: 0, Fence: fence, Jobs: jobs}, f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func results(out []keylanepg.Outcome) []string {
	var s []string
	for _, o := range out {
		if o.Err != nil {
			s = append(s, fmt.Sprintf("%s: %v", o.Status, o.Err))
			continue
		}
		s = append(s, fmt.Sprintf("%s %s", o.Status, o.Result))
	}
	return s
}

func scalar(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSetMatchesOneByOne: a transaction of purchases of two SKUs, their
// keys interleaved, sells the same through the set type "buy" (one
// statement for the run) as through "buy-one" (a statement a job): the
// same results, the same stock and order rows. A restock and a stock
// query in the middle end the run, in order.
func TestSetMatchesOneByOne(t *testing.T) {
	pool, f := startShop(t)
	var want []string
	for _, typ := range []string{"buy-one", "buy"} {
		p := typ + "-"
		jobs := []keylane.Job{
			job(p+"r1", "restock", p+"a", `{"n": 3}`),
			job(p+"r2", "restock", p+"b", `{"n": 1}`),
		}
		for i := range 5 {
			jobs = append(jobs, job(fmt.Sprintf("%so%d", p, i), typ, p+"a", `{"qty": 1}`), job(fmt.Sprintf("%sq%d", p, i), typ, p+"b", `{"qty": 1}`))
			if i == 2 {
				jobs = append(jobs, job(p+"r3", "restock", p+"b", `{"n": 2}`), job(p+"s1", "stock", p+"b", `{}`))
			}
		}
		jobs = append(jobs, job(p+"l", "orders", p+"b", ""))
		var got []string
		for _, r := range results(apply(t, pool, f, jobs...)) {
			got = append(got, strings.ReplaceAll(r, p, ""))
		}
		if want == nil {
			want = got
			t.Logf("%s:\n%s", typ, strings.Join(got, "\n"))
			continue
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("set:\n%s\nwant buy-one's:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	for _, sku := range []string{"a", "b"} {
		one := scalar(t, pool, `SELECT n || ' ' || (SELECT count(*) FROM orders WHERE sku = $1) FROM stock WHERE sku = $1`, "buy-one-"+sku)
		set := scalar(t, pool, `SELECT n || ' ' || (SELECT count(*) FROM orders WHERE sku = $1) FROM stock WHERE sku = $1`, "buy-"+sku)
		if one != set || one != "0 3" && one != "0 4" {
			t.Errorf("%s: stock and orders %q by one, %q by set", sku, one, set)
		}
	}
	// a: 3 sold of 3; b: 1, then restocked to 2, 2 sold: 3 orders each.
	if got := scalar(t, pool, `SELECT string_agg(sku || '=' || c, ' ' ORDER BY sku) FROM (SELECT sku, count(*) c FROM orders GROUP BY sku) x`); got != "buy-a=3 buy-b=3 buy-one-a=3 buy-one-b=3" {
		t.Errorf("orders: %s", got)
	}
}

// TestBadJobsFailForGood: a job whose type the file lacks, whose payload
// lacks a field, has one more, is no JSON object, or holds a value the
// server refuses (not a number; a constraint broken) fails for good, with
// an error that says why, and alone: the group's other jobs commit.
func TestBadJobsFailForGood(t *testing.T) {
	pool, f := startShop(t)
	apply(t, pool, f, job("r", "restock", "s", `{"n": 100}`))
	bad := []struct {
		job  keylane.Job
		says string
	}{
		{job("t1", "sell", "s", `{"qty": 1}`), `type "sell" is not in the SQL file`},
		{job("t2", "", "s", `{"qty": 1}`), `type "" is not in the SQL file`},
		{job("m1", "buy", "s", `{}`), "lacks field(s) qty"},
		{job("m2", "buy-one", "s", `{"qtty": 1}`), "lacks field(s) qty"},
		{job("x1", "buy", "s", `{"qty": 1, "note": "gift"}`), "has field(s) note, which the type does not take"},
		{job("j1", "buy", "s", `[1]`), "not a JSON object"},
		{job("j2", "buy-one", "s", `buy 1`), "not a JSON object"},
		{job("v1", "buy", "s", `{"qty": "one"}`), "invalid input syntax for type bigint"},
		{job("v2", "buy-one", "s", `{"qty": 1.5}`), "invalid input syntax for type bigint"},
		{job("v3", "buy-one", "s", `{"qty": 0}`), "orders_qty_check"},
		{job("v4", "restock", "s2", `{"n": -1}`), "stock_n_check"},
		{job("v5", "buy", "s", `{"qty": 99999999999999999999}`), "out of range"},
	}
	for i, b := range bad {
		jobs := []keylane.Job{job(fmt.Sprintf("ok%d", i), "buy", "s", `{"qty": 1}`), b.job, job(fmt.Sprintf("ok%db", i), "buy", "s", `{"qty": 1}`)}
		out := apply(t, pool, f, jobs...)
		if out[0].Status != keylanepg.Applied || out[2].Status != keylanepg.Applied {
			t.Errorf("%s: the good jobs beside it: %q", b.job.ID, results(out))
		}
		o := out[1]
		if o.Status != keylanepg.Failed || !errors.Is(o.Err, keylane.ErrPermanent) || !strings.Contains(o.Err.Error(), b.says) {
			t.Errorf("%s %s %s: %s %v; want failed for good saying %q", b.job.ID, b.job.Type, b.job.Payload, o.Status, o.Err, b.says)
		}
	}
	if got := scalar(t, pool, `SELECT n || ' ' || (SELECT count(*) FROM orders) FROM stock WHERE sku = 's'`); got != fmt.Sprintf("%d %d", 100-2*len(bad), 2*len(bad)) {
		t.Errorf("stock and orders: %s; want only the good jobs' %d", got, 2*len(bad))
	}
}

// TestResultKinds: "rows" is an array of row objects, "row" one object
// or null, and a "row" type whose statement returns two rows fails for
// good; columns keep their order and come back in JSON.
func TestResultKinds(t *testing.T) {
	pool, _ := startShop(t)
	f, err := sqlfile.Parse([]byte(`{"jobs": {
		"rows": {"fields": ["k"], "statements": ["SELECT g AS i, :k::text AS k FROM generate_series(1, 2) g"]},
		"row": {"statements": ["SELECT 1.50::numeric AS a, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS u, DATE '2026-11-29' AS d, NULL::int AS z, '{\"x\": [1]}'::jsonb AS j, interval '1 day' AS iv"], "result": "row"},
		"none": {"statements": ["SELECT 1 WHERE false"], "result": "row"},
		"two": {"statements": ["SELECT 1 AS x UNION ALL SELECT 2"], "result": "row"},
		"quiet": {"fields": ["n"], "statements": ["SELECT :n::int"], "result": "none"}
	}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Check(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	out := apply(t, pool, f, job("a", "rows", "k", `{"k": "v"}`), job("b", "row", "k", ""), job("c", "none", "k", "{}"), job("d", "two", "k", ""), job("e", "quiet", "k", `{"n": null}`))
	want := []string{
		`applied [{"i":1,"k":"v"},{"i":2,"k":"v"}]`,
		`applied {"a":1.50,"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","d":"2026-11-29","z":null,"j":{"x":[1]},"iv":"1 day 00:00:00"}`,
		`applied null`,
		`failed: sqlfile: job d (type "two"): its statement returned 2 rows, and its result is one ("result": "row")`,
		`applied null`,
	}
	if got := results(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("results:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !errors.Is(out[3].Err, keylane.ErrPermanent) {
		t.Errorf("two rows for one: %v, not for good", out[3].Err)
	}
}

// TestCheckRefuses: Check prepares every statement and reports, with
// ErrInvalid, each one the server refuses or that cannot make its
// result, naming the type and statement; nothing runs.
func TestCheckRefuses(t *testing.T) {
	pool, _ := startShop(t)
	f, err := sqlfile.Parse([]byte(`{"jobs": {
		"typo": {"fields": ["qty"], "statements": ["UPDATE stock SET n = n - :qty WHERE skuu = :job.key"], "result": "none"},
		"syntax": {"statements": ["SELEC 1"]},
		"table": {"statements": ["SELECT n FROM stocks"]},
		"untyped": {"fields": ["x"], "statements": ["SELECT 1 WHERE :x IS NULL"]},
		"two": {"statements": ["SELECT 1; SELECT 2"]},
		"norows": {"fields": ["n"], "statements": ["UPDATE stock SET n = :n WHERE sku = :job.key"]},
		"twice": {"statements": ["SELECT 1 AS a, 2 AS a"]},
		"setscalar": {"set": true, "fields": ["qty"], "statements": ["SELECT u.job_id FROM unnest(:job.id::text[]) u(job_id) WHERE :qty::bigint > 0"]},
		"setnoid": {"set": true, "statements": ["SELECT u.id FROM unnest(:job.id::text[]) u(id)"]},
		"ok": {"fields": ["n"], "statements": ["DELETE FROM stock WHERE n < :n"], "result": "none"}
	}}`))
	if err != nil {
		t.Fatal(err)
	}
	err = f.Check(context.Background(), pool)
	if !errors.Is(err, sqlfile.ErrInvalid) {
		t.Fatalf("Check = %v; want ErrInvalid", err)
	}
	t.Log(err)
	for _, says := range []string{
		`job type "typo": statement 1: the server will not prepare it: ERROR: column "skuu" does not exist`,
		`job type "syntax": statement 1: the server will not prepare it: ERROR: syntax error at or near "SELEC"`,
		`job type "table": statement 1: the server will not prepare it: ERROR: relation "stocks" does not exist`,
		`job type "untyped": statement 1: the server will not prepare it: ERROR: could not determine data type of parameter $1`,
		`job type "two": statement 1: the server will not prepare it: ERROR: cannot insert multiple commands into a prepared statement`,
		`job type "norows": statement 1: it makes the job's result ("rows") but returns no rows`,
		`job type "twice": statement 1: column "a" returned twice`,
		`job type "setscalar": statement 1: :qty is bigint: in a set type every parameter is an array`,
		`job type "setnoid": statement 1: a set type's result rows each name their job: return a column job_id`,
	} {
		if !strings.Contains(err.Error(), says) {
			t.Errorf("Check's error does not say %q", says)
		}
	}
	if strings.Contains(err.Error(), `"ok"`) {
		t.Errorf("Check refused the good type: %v", err)
	}
	if got := scalar(t, pool, `SELECT count(*) FROM stock`); got != "0" {
		t.Errorf("Check ran something: %s stock rows", got)
	}
}
