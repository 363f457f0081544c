package keylanepg_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/keylane/keylane"
	keylanepg "github.com/keylane/keylane/pg"
	"github.com/keylane/keylane/pg/pgtest"
)

func connect(t *testing.T, s *pgtest.Server, user string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.URL(user, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestEnsureWithoutRights connects as a role with no CREATE right on the
// schema (PostgreSQL 15's default for a new role) and no right on
// keylane's tables: Ensure fails with a SchemaError wrapping ErrPrivilege
// that names the role and the cure, first for the missing tables, then,
// once an owner made them, for the missing grants; once granted, it
// passes.
func TestEnsureWithoutRights(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	admin := connect(t, s, "postgres")
	if _, err := admin.Exec(ctx, `CREATE ROLE app LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC`); err != nil {
		t.Fatal(err)
	}
	app := connect(t, s, "app")

	err := keylanepg.Ensure(ctx, app)
	var se *keylanepg.SchemaError
	if !errors.As(err, &se) || !errors.Is(err, keylanepg.ErrPrivilege) || !errors.Is(err, keylanepg.ErrSchema) ||
		se.Role != "app" || !strings.Contains(err.Error(), "may not create") || !strings.Contains(err.Error(), "GRANT CREATE ON SCHEMA public TO app") {
		t.Fatalf("Ensure without the CREATE right: %v", err)
	}
	t.Logf("without CREATE: %v", err)

	if err := keylanepg.Ensure(ctx, admin); err != nil {
		t.Fatalf("Ensure as the owner: %v", err)
	}
	err = keylanepg.Ensure(ctx, app)
	if !errors.As(err, &se) || !errors.Is(err, keylanepg.ErrPrivilege) || se.Table != "keylane_fences" ||
		!strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE ON keylane_fences TO app") {
		t.Fatalf("Ensure without grants on the tables: %v", err)
	}
	t.Logf("without grants: %v", err)
	if _, err := admin.Exec(ctx, `GRANT SELECT, INSERT, UPDATE ON keylane_fences TO app; GRANT SELECT, INSERT ON keylane_outcomes TO app`); err != nil {
		t.Fatal(err)
	}
	err = keylanepg.Ensure(ctx, app)
	if !errors.As(err, &se) || se.Table != "keylane_outcomes" || !strings.Contains(err.Error(), "lacks DELETE") {
		t.Fatalf("Ensure without DELETE on the outcomes: %v", err)
	}
	if _, err := admin.Exec(ctx, `GRANT DELETE ON keylane_outcomes TO app`); err != nil {
		t.Fatal(err)
	}
	if err := keylanepg.Ensure(ctx, app); err != nil {
		t.Fatalf("Ensure with every right: %v", err)
	}
}

// TestEnsureChecksTheColumns finds a keylane_outcomes that is not
// keylane's: Ensure fails naming the columns, and creates nothing over
// it. Ensure on the right tables is idempotent.
func TestEnsureChecksTheColumns(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	db := connect(t, s, "postgres")
	if _, err := db.Exec(ctx, `CREATE TABLE keylane_outcomes (id int)`); err != nil {
		t.Fatal(err)
	}
	err := keylanepg.Ensure(ctx, db)
	var se *keylanepg.SchemaError
	if !errors.As(err, &se) || se.Table != "keylane_outcomes" || errors.Is(err, keylanepg.ErrPrivilege) || !strings.Contains(err.Error(), "has not the columns") {
		t.Fatalf("Ensure over a foreign table: %v", err)
	}
	if _, err := db.Exec(ctx, `DROP TABLE keylane_outcomes`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := keylanepg.Ensure(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
}

// TestApplierSaysARevokedPrivilegeIsForGood: keylane's own statements
// refused for what they are (the role lost its rights on keylane_fences)
// come back from Applier.ApplyGroup errors.Is keylane.ErrPermanent, which
// the worker holds its jobs for and says at ERROR (an operator's to fix);
// a failure a retry may cure (the group's context ended) does not.
func TestApplierSaysARevokedPrivilegeIsForGood(t *testing.T) {
	s := pgtest.Start(t)
	ctx := context.Background()
	admin := connect(t, s, "postgres")
	if err := keylanepg.Ensure(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE ROLE app LOGIN`); err != nil {
		t.Fatal(err)
	}
	app := connect(t, s, "app")
	a := &keylanepg.Applier{DB: app, Handler: keylanepg.HandlerFunc(func(context.Context, pgx.Tx, keylane.Job) ([]byte, error) { return []byte("ok"), nil })}
	g := keylane.JobGroup{Namespace: "ns", Partition: 0, Fence: 1, Jobs: []keylane.Job{{ID: "j1", Key: "sku:1"}}}
	_, err := a.ApplyGroup(ctx, g)
	if err == nil || !errors.Is(err, keylane.ErrPermanent) {
		t.Fatalf("ApplyGroup without rights: %v; want a permanent refusal", err)
	}
	t.Logf("without rights: %v", err)
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := a.ApplyGroup(done, g); err == nil || errors.Is(err, keylane.ErrPermanent) {
		t.Fatalf("ApplyGroup with its context ended: %v; want a failure that is not permanent", err)
	}
}
