package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestKillAndRestartKeepTheCommittedRows starts a server, commits a row,
// SIGKILLs the server and restarts it: the row is there after recovery.
func TestKillAndRestartKeepTheCommittedRows(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (n int); INSERT INTO t VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	s.Kill()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, s.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT n FROM t").Scan(&n); err != nil || n != 7 {
		t.Fatalf("after restart: n=%d err=%v", n, err)
	}
}
