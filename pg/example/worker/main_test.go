package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/keylane/keylane"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/pg/pgtest"
)

// TestWorkerSells runs the documented worker against a real nats-server
// and PostgreSQL: a purchase by order ID sells and writes its order; a
// retry with the same ID is answered the same, selling nothing more; a
// job of another type fails for good; the worker stops when asked.
func TestWorkerSells(t *testing.T) {
	pg := pgtest.Start(t)
	ns := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(wctx, ns.ClientURL(), pg.URL("postgres", "postgres")) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	pool, err := pgxpool.New(ctx, pg.URL("postgres", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	testwait.NoError(t, time.Minute, "the worker created the shop's tables", func() error {
		_, err := pool.Exec(ctx, `INSERT INTO stock (sku, n) VALUES ('sku-1', 5)`)
		return err
	})
	nc := natstest.Connect(t, ns)
	var c *keylane.Client
	testwait.NoError(t, time.Minute, "the worker set the namespace up", func() error {
		c, err = keylane.NewClient(ctx, nc, keylane.ClientConfig{Namespace: "shop"})
		return err
	})
	defer c.Close()
	for range 2 { // the second time, a customer's retry by order ID
		res, err := c.Call(ctx, "sku-1", []byte(`{"qty": 2}`), keylane.WithType("buy"), keylane.WithID("order-1"))
		if err != nil || string(res) != `{"sold":true,"left":3}` {
			t.Fatalf("buy: %s, %v", res, err)
		}
	}
	var n, orders int
	if err := pool.QueryRow(ctx, `SELECT n, (SELECT count(*) FROM orders) FROM stock WHERE sku = 'sku-1'`).Scan(&n, &orders); err != nil || n != 3 || orders != 1 {
		t.Errorf("stock %d, %d orders, %v; want 3 and 1", n, orders, err)
	}
	_, err = c.Call(ctx, "sku-1", []byte(`{"qty": 1}`), keylane.WithType("sell"))
	if err == nil || !strings.Contains(err.Error(), `job type "sell": this worker sells`) {
		t.Errorf("a job of another type: %v", err)
	}
}

// TestDocsShowThisFile: docs/database.md shows main.go whole, so that the
// page's worker is one that compiles and passes TestWorkerSells.
func TestDocsShowThisFile(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/database.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```go\n"+string(src)+"```\n") {
		t.Error("docs/database.md does not show pg/example/worker/main.go as it is: copy the file into its ```go block")
	}
}
