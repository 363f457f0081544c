package bench

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keylane/keylane/internal/redistest"
)

// TestQuick runs the whole harness, every workload and contender, with
// tiny counts against the embedded placement, and checks that the table
// has every row and that every row kept the invariant.
func TestQuick(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	natsOnly := []string{"keylane", "raw JS"}
	_, err := exec.LookPath(redistest.Binary())
	redis := err == nil
	cfg := Config{
		Runs: 1, Purchases: 150, Duration: 500 * time.Millisecond,
		Buyers: []int{8}, SKUs: 50, Placements: []Placement{Embedded},
		Markdown: true, Progress: testWriter{t},
	}
	if !redis {
		cfg.Only = natsOnly
	}
	// A bound for a loaded machine: about 2 minutes on a quiet one.
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = Run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}

	// Markdown rows: | workload | NATS | contender | ... | invariant |
	got := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Split(strings.Trim(line, "| "), " | ")
		if len(f) == len(columns) && f[0] != "workload" {
			got[f[0]+"/"+f[2]+"/"+f[1]] = f[len(f)-1]
		}
	}
	check := func(t *testing.T, names ...string) {
		t.Helper()
		for _, w := range []string{"hot b=8", "skewed b=64", "slow b=64", "hot b=8 fsync"} {
			for _, name := range names {
				place := "-"
				if (strings.HasPrefix(name, "keylane") && !strings.Contains(name, "Postgres")) || strings.HasPrefix(name, "raw JS") {
					place = string(Embedded)
				}
				// Limits and the Postgres rows have no hold: no slow row.
				limit := name == rawRR || name == rawPC || name == luaRow || strings.Contains(name, "Postgres")
				row := w + "/" + name + "/" + place
				inv, ok := got[row]
				switch {
				case limit && w == "slow b=64":
					if ok {
						t.Errorf("row %s: limits and Postgres rows have no slow row", row)
					}
				case !ok:
					t.Errorf("row %s missing", row)
				case inv != "ok":
					t.Errorf("row %s: invariant %s", row, inv)
				}
			}
		}
	}
	t.Run("nats", func(t *testing.T) {
		check(t, "keylane Call", "keylane Submit", "keylane Call, no IDs", "keylane Submit, no IDs", rawRR, rawPC)
	})
	t.Run("postgres", func(t *testing.T) {
		if _, err := pgAvailable(); err != nil {
			t.Skip(err)
		}
		check(t, pgKeylaneRow, pgKeylaneRow+", no IDs", pgSubmitRow, pgUpdateRow, pgForUpdateRow)
		for _, w := range []string{"skewed b=64 fsync", "skewed-ample b=64 fsync"} {
			for _, name := range []string{pgKeylaneRow, pgSubmitRow, pgUpdateRow, pgForUpdateRow} {
				if inv := got[w+"/"+name+"/-"]; inv != "ok" {
					t.Errorf("row %s/%s: invariant %q", w, name, inv)
				}
			}
		}
	})
	t.Run("redis", func(t *testing.T) {
		if !redis {
			t.Skip("redis-server is not installed")
		}
		check(t, "fallback.Do", "redsync", "redsync tuned", "redislock", "redislock tuned", luaRow)
	})
}

func TestOnly(t *testing.T) {
	cfg := Config{Only: []string{"skewed", "Lua"}}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	plan, err := cfg.plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 1 || plan[0].id() != "skewed b=64 | Lua EVALSHA" {
		t.Fatalf("plan %v, want the skewed Lua row only", plan)
	}
	cfg.Only = []string{"nosuchthing"}
	if _, err := cfg.plan(); err == nil {
		t.Fatal("an --only term that names nothing was accepted")
	}
}

func TestParseRSS(t *testing.T) {
	rss, err := parseRSS(strings.NewReader("Name:\tx\nVmHWM:\t  900 kB\nVmRSS:\t  512 kB\n"))
	if err != nil || rss != 512<<10 {
		t.Fatalf("rss %d, %v; want %d", rss, err, 512<<10)
	}
}

// testWriter logs each write, a progress line, to the test.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// memShop keeps stock in memory; its bugs let a test break the invariant.
type memShop struct {
	mu        sync.Mutex
	left      map[string]int64
	loseEvery int  // every n-th sale is reported but not decremented
	oversell  bool // sells below zero
	sales     int
}

func (s *memShop) stock(_ context.Context, skus []string, n int64) error {
	s.left = map[string]int64{}
	for _, k := range skus {
		s.left[k] = n
	}
	return nil
}

func (s *memShop) buy(_ context.Context, sku, _ string) (bool, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left[sku] <= 0 && !s.oversell {
		return false, 0, nil
	}
	s.sales++
	if s.loseEvery > 0 && s.sales%s.loseEvery == 0 {
		return true, 0, nil
	}
	s.left[sku]--
	return true, 0, nil
}

func (s *memShop) levels(_ context.Context, skus []string) ([]int64, error) {
	out := make([]int64, len(skus))
	for i, k := range skus {
		out[i] = s.left[k]
	}
	return out, nil
}

func TestSellChecksInvariant(t *testing.T) {
	w := Workload{Name: "hot", Buyers: 4, SKUs: 3, Skew: 1.1, Purchases: 100, Duration: 10 * time.Second}
	for _, tc := range []struct {
		name  string
		shop  *memShop
		stock int64
		want  string
	}{
		{"correct", &memShop{}, 20, "ok"},
		// With stock to spare, a lost decrement shows as stock left over;
		// once sales pass the stock, as overselling.
		{"lost update", &memShop{loseEvery: 10}, 1000, "LOST 10"},
		{"lost update sold out", &memShop{loseEvery: 10}, 20, "OVERSOLD"},
		{"oversell", &memShop{oversell: true}, 20, "OVERSOLD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := w
			w.Stock = tc.stock
			res, err := sell(context.Background(), w, tc.shop, false, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Check(); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("check %q, want %s", got, tc.want)
			}
			if res.Jobs != w.Purchases {
				t.Fatalf("%d purchases ran, want %d", res.Jobs, w.Purchases)
			}
		})
	}
}

// TestPostgresRowsSkippedWithoutPostgres: with no postgres binaries, the
// plan loses its Postgres rows and says so in one line; the rest stays.
func TestPostgresRowsSkippedWithoutPostgres(t *testing.T) {
	t.Setenv("PGTEST_BINDIR", t.TempDir())
	cfg := Config{Only: []string{"hot b=64", "Postgres", "Lua"}}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	plan, err := cfg.plan()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	kept, err := withoutPostgres(plan, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(kept) != 2 || kept[0].s.c.Name() != luaRow {
		t.Errorf("kept %v, want the two Lua rows", kept)
	}
	if !strings.HasPrefix(out.String(), "Postgres rows skipped: no initdb in ") {
		t.Errorf("said %q", out.String())
	}
	cfg.Only = []string{"Postgres"}
	if plan, err = cfg.plan(); err != nil {
		t.Fatal(err)
	}
	if _, err := withoutPostgres(plan, io.Discard); err == nil {
		t.Error("a plan of Postgres rows alone ran without postgres")
	}
}
