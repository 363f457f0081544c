package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestSaleLocalPostgres runs the command against a throwaway postgres:
// one hot SKU and a zipf sale over several, each checked against the
// database's rows. Fails if a verdict line is missing or says FAILED, or
// if the database's rows disagree with the buyers' answers.
func TestSaleLocalPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"--postgres", "local", "--skus", "3", "--stock", "100", "--purchases", "600", "--buyers", "32", "--workers", "2", "--partitions", "4"}, &out, &errOut)
	t.Log(out.String())
	if err != nil {
		t.Fatalf("sale: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"verdict: OK", "stock = start − sold for 3 of 3 SKUs, 0 rows without their outcome", "verdict (database): OK", "synchronous_commit=on"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestSaleNeedsPostgres: without --postgres the command says what it needs.
func TestSaleNeedsPostgres(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	var out, errOut bytes.Buffer
	err := run(context.Background(), nil, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--postgres") {
		t.Fatalf("got %v, want an error naming --postgres", err)
	}
}
