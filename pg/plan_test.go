package keylanepg

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane/pg/pgtest"
)

// TestOutcomeLookupProbesTheIndex plans a group's outcome look-up the
// ways the server may (a custom plan, the generic plan a cached statement
// ends up with) over a table of a few thousand outcomes: each probes the
// primary key and none scans the table. The look-up as first written
// (job_id = ANY($2)) was a scan that compared each row with every ID; the
// bench's group of 128 spent 7 ms in it after 40 groups, ever more.
func TestOutcomeLookupProbesTheIndex(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := Ensure(ctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO keylane_outcomes SELECT 'ns', 'j' || i, 'k', 1, '', now() FROM generate_series(1, 5000) AS i`); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 128)
	for i := range ids {
		ids[i] = fmt.Sprint("j", 1000+i)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "PREPARE lookup(text, text[]) AS "+outcomesSQL); err != nil {
			t.Fatal(err)
		}
		rows, _ := conn.Query(ctx, "EXPLAIN EXECUTE lookup('ns', '{"+strings.Join(ids, ",")+"}')", pgx.QueryExecModeSimpleProtocol)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan on keylane_outcomes") || !strings.Contains(plan, "keylane_outcomes_pkey") {
			t.Errorf("%s: the look-up does not probe the primary key:\n%s", mode, plan)
		}
		if _, err := conn.Exec(ctx, "DEALLOCATE lookup"); err != nil {
			t.Fatal(err)
		}
	}
}
