package bench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// row is one line of the table: the runs of one entry, summarized.
type row struct {
	*entry
	med      Result  // the run of median jobs/s
	lo, hi   float64 // min and max jobs/s
	ok       bool    // every run ok
	check    string
	bestPeer float64 // jobs/s over the best ok peer's of the workload; 0: none
	ofLimit  float64 // jobs/s over its limit's, in percent; 0: none
}

func summarize(plan []*entry) []*row {
	rows := make([]*row, len(plan))
	for i, e := range plan {
		r := &row{entry: e, ok: len(e.results) > 0, check: "ok"}
		broken := 0
		for _, res := range e.results {
			if c := res.Check(); c != "ok" {
				if broken == 0 {
					r.check = c
				}
				broken++
				r.ok = false
			}
		}
		if broken > 0 {
			r.check += fmt.Sprintf(" (%d/%d runs)", broken, len(e.results))
		}
		byRate := slices.Clone(e.results)
		slices.SortFunc(byRate, func(a, b Result) int { return cmp.Compare(a.Rate(), b.Rate()) })
		if len(byRate) > 0 {
			r.med = byRate[(len(byRate)-1)/2]
			r.lo, r.hi = byRate[0].Rate(), byRate[len(byRate)-1].Rate()
		}
		rows[i] = r
	}
	for _, r := range rows {
		if !r.ok {
			continue
		}
		best := 0.0
		for _, p := range rows {
			if p.ok && p.w == r.w && p.s.c.Kind() == Peer && p.s.pg == r.s.pg {
				best = max(best, p.med.Rate())
			}
		}
		if best > 0 {
			r.bestPeer = r.med.Rate() / best
		}
		for _, l := range rows {
			if l.ok && l.w == r.w && l.s.c.Name() == r.s.limit && l.placement == r.placement && l.med.Rate() > 0 {
				r.ofLimit = 100 * r.med.Rate() / l.med.Rate()
			}
		}
	}
	return rows
}

var columns = []string{"workload", "NATS", "contender", "jobs/s", "min-max", "p50", "p99", "×best peer", "% of limit",
	"lock calls/op", "server MB", "server µs/job", "worker MB", "worker µs/job", "worker allocs/job",
	"client µs/job", "client allocs/job", "invariant"}

// printTable writes the rows as aligned text or as Markdown, with notes.
func printTable(out io.Writer, rows []*row, markdown bool) {
	cells := make([][]string, len(rows))
	for i, r := range rows {
		cells[i] = r.cells()
	}
	if markdown {
		fmt.Fprintln(out, "| "+strings.Join(columns, " | ")+" |")
		sep := make([]string, len(columns))
		for i := range sep {
			sep[i] = "--:"
			if i < 3 || i == len(columns)-1 {
				sep[i] = "---"
			}
		}
		fmt.Fprintln(out, "|"+strings.Join(sep, "|")+"|")
		for _, c := range cells {
			fmt.Fprintln(out, "| "+strings.Join(c, " | ")+" |")
		}
	} else {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(columns, "\t"))
		last := ""
		for i, c := range cells {
			if l := rows[i].w.Label(); l != last && last != "" {
				fmt.Fprintln(tw, strings.Repeat("\t", len(columns)-1)) // a gap that keeps the columns
			}
			last = rows[i].w.Label()
			fmt.Fprintln(tw, strings.Join(c, "\t"))
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, `jobs/s: median of the runs (min-max of all); p50, p99, CPU and MB from the median run; "-": not applicable or not ranked.
Submit and publish+consume have no buyers (one bulk publisher): their hot-key rows repeat one sale at every buyer count.
×best peer: over the best lock peer (fallback.Do, redsync, redislock) of the workload that kept the invariant; the Postgres rows over the best "Postgres alone" row (UPDATE, FOR UPDATE tx).
% of limit: keylane Call over raw JS request-reply and keylane Submit over raw JS publish+consume, same placement; locks over Lua EVALSHA.
µs/job: CPU microseconds per purchase in the timed part (user + system); allocs/job: Go heap allocations per purchase; MB: peak resident set.
server = nats-server or redis-server process (cluster: the three nodes' sum); worker = keylane's worker process or the raw consumer's;
client = the bench process (the buyers, keylane's Client), separate and cluster placements only; * = embedded: the whole bench process (server, workers and buyers).
invariant: ok = no SKU sold beyond its stock and every final stock = start - sold, in every run.`)
}

func (r *row) cells() []string {
	nats := r.where()
	if nats == "" {
		nats = "-"
	}
	m := r.med
	c := []string{r.w.Label(), nats, r.s.c.Name(), fmt.Sprintf("%.0f", m.Rate()), fmt.Sprintf("%.0f-%.0f", r.lo, r.hi),
		fmtDur(m.P50), fmtDur(m.P99), "-", "-", "-"}
	if r.bestPeer > 0 {
		c[7] = fmt.Sprintf("%.2f×", r.bestPeer)
	}
	switch {
	case r.s.c.Kind() == Limit:
		c[8] = "limit"
	case r.ofLimit > 0:
		c[8] = fmt.Sprintf("%.0f%%", r.ofLimit)
	}
	if m.Calls > 0 {
		c[9] = fmt.Sprintf("%.1f", m.Calls)
	}
	mark := ""
	if r.placement == Embedded {
		mark = "*"
	}
	c = append(c, fmtMB(m.Server, ""), fmtCPU(m.Server, m.Jobs, ""), fmtMB(m.Worker, mark), fmtCPU(m.Worker, m.Jobs, mark),
		fmtAllocs(m.Worker, m.Jobs, mark), fmtCPU(m.Client, m.Jobs, ""), fmtAllocs(m.Client, m.Jobs, ""), r.check)
	return c
}

func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case d <= 0:
		return "-"
	case ms < 10:
		return fmt.Sprintf("%.2fms", ms)
	case ms < 100:
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.0fms", ms)
}

func fmtMB(u usage, mark string) string {
	if u.RSS == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%s", float64(u.RSS)/(1<<20), mark)
}

// fmtCPU is CPU microseconds per job.
func fmtCPU(u usage, jobs int, mark string) string {
	if u.RSS == 0 || jobs == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%s", float64(u.CPU.Microseconds())/float64(jobs), mark)
}

// fmtAllocs is heap allocations per job.
func fmtAllocs(u usage, jobs int, mark string) string {
	if !u.HasAllocs || jobs == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%s", float64(u.Allocs)/float64(jobs), mark)
}
