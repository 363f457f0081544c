package metrics

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// metricRow is one metric a documentation table promises: its name, the
// labels written in its braces, and its type.
type metricRow struct {
	file, name, kind string
	labels           []string
}

// tableRow is a row of a metric table: "| `keylane_a{x,y}`, `keylane_b` | counter | … |".
var (
	tableRow   = regexp.MustCompile("^\\|\\s*(`keylane_[^|]*)\\|\\s*([a-z]+)\\s*\\|")
	tableCell  = regexp.MustCompile("`(keylane_[a-z0-9_]+)(?:\\{([a-z_,]*)\\})?`")
	docPages   = []string{"../README.md", "../docs/*.md"}
	histograms = "histogram"
)

// documentedMetrics reads every metric table of the README and of the
// pages under docs/.
func documentedMetrics(t *testing.T) []metricRow {
	t.Helper()
	var rows []metricRow
	for _, pattern := range docPages {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(raw), "\n") {
				m := tableRow.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				for _, c := range tableCell.FindAllStringSubmatch(m[1], -1) {
					r := metricRow{file: f, name: c[1], kind: m[2]}
					if c[2] != "" {
						r.labels = strings.Split(c[2], ",")
					}
					rows = append(rows, r)
				}
			}
		}
	}
	return rows
}

// Every metric the README's (and docs/'s) metric tables list is exported,
// with the type they say and exactly the labels they promise: those in
// its braces, and "worker" on a worker's counters and gauges (the README:
// "The worker's counters and gauges carry a worker label; the histograms
// carry none"), never on a client's.
func TestDocumentedMetricsHaveTheirLabels(t *testing.T) {
	rows := documentedMetrics(t)
	if len(rows) < 20 {
		t.Fatalf("found %d documented metrics, want the README's table", len(rows))
	}
	fams := exportedFamilies(t)
	for _, r := range rows {
		want := slices.Clone(r.labels)
		if r.kind != histograms && !strings.HasPrefix(r.name, "keylane_client_") && !slices.Contains(want, "namespace") && r.name != "keylane_build_info" {
			want = append(want, "worker")
		}
		slices.Sort(want)
		mf := fams[r.name]
		if mf == nil {
			t.Errorf("%s lists %s, which is not exported", r.file, r.name)
			continue
		}
		if got := strings.ToLower(mf.GetType().String()); got != r.kind {
			t.Errorf("%s lists %s as a %s; it is a %s", r.file, r.name, r.kind, got)
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, lp.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s has labels %q, want %q", r.file, r.name, got, want)
				break
			}
		}
	}
}
