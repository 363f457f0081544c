package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// dashboardFile is the Grafana dashboard shipped in the repository.
const dashboardFile = "../docs/grafana/keylane.json"

// exprs returns every PromQL expression in a dashboard: the "expr" of
// every target of every panel, rows' nested panels included, and every
// query of a query template variable.
func exprs(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" {
				out = append(out, s)
				continue
			}
			out = append(out, exprs(x)...)
		}
		if v["type"] == "query" {
			if q, ok := v["query"].(string); ok {
				out = append(out, q)
			}
		}
	case []any:
		for _, x := range v {
			out = append(out, exprs(x)...)
		}
	}
	return out
}

var (
	promStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promBraces   = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promToken    = regexp.MustCompile(`\.?[0-9][0-9a-zA-Z_.]*(?:[eE][+-][0-9]+)?|[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression selects: its
// identifiers that are not functions or aggregations (followed by '('),
// keywords, label names (in matchers or grouping clauses), strings,
// durations or numbers. label_values(metric, label) yields its metric.
func metricNames(expr string) []string {
	if rest, ok := strings.CutPrefix(strings.TrimSpace(expr), "label_values("); ok {
		metric, _, _ := strings.Cut(rest, ",")
		return metricNames(metric)
	}
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promBraces.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var names []string
	for _, m := range promToken.FindAllStringSubmatch(e, -1) {
		tok := m[0]
		if m[1] != "" || tok[0] >= '0' && tok[0] <= '9' || tok[0] == '.' || slices.Contains(promKeywords, tok) {
			continue
		}
		names = append(names, tok)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (le, op) (rate(keylane_client_request_seconds_bucket{op="call"}[$__rate_interval])))`: {"keylane_client_request_seconds_bucket"},
		`sum(rate(a_sum[5m])) / sum(rate(a_count[5m])) > 1e3`:                                                                  {"a_sum", "a_count"},
		`min by (partition) (keylane_lease_trusted_for_seconds{worker=~"w.*"}) and on(partition) up offset 5m`:                 {"keylane_lease_trusted_for_seconds", "up"},
		`label_values(keylane_partitions_owned, namespace)`:                                                                    {"keylane_partitions_owned"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %q, want %q", expr, got, want)
		}
	}
}

// Every metric the dashboard queries is one a worker or client exports,
// after real jobs ran; and the dashboard shows every metric of the
// histograms, the per-partition gauges and the dead letters. Renaming a
// metric without the dashboard (or the reverse) fails here.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash["title"] == nil || dash["panels"] == nil {
		t.Fatalf("%s has no title or panels", dashboardFile)
	}
	queries := exprs(dash)
	if len(queries) < 10 {
		t.Fatalf("%s has %d queries, want a dashboard's worth", dashboardFile, len(queries))
	}

	// ALERTS is Prometheus's own series of the alerts its rules fire.
	exported := map[string]bool{"ALERTS": true}
	for name, mf := range exportedFamilies(t) {
		exported[name] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
	}

	used := map[string]bool{}
	for _, q := range queries {
		names := metricNames(q)
		if len(names) == 0 {
			t.Errorf("query selects no metric: %s", q)
		}
		for _, n := range names {
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			if !exported[n] {
				t.Errorf("the dashboard queries %s, which keylane does not export (query: %s)", n, q)
			}
		}
	}
	for _, must := range []string{
		"keylane_job_queue_wait_seconds", "keylane_job_run_seconds", "keylane_job_end_to_end_seconds", "keylane_group_jobs",
		"keylane_partition_backlog", "keylane_partition_in_flight",
		"keylane_lease_renew_seconds", "keylane_lease_trusted_for_seconds",
		"keylane_jobs_succeeded_total", "keylane_jobs_dead_lettered_total",
		"keylane_client_jobs_total", "keylane_client_request_seconds",
		// The paging signals, each rule of docs/alerts.yml's gauge.
		"keylane_namespace_workers", "keylane_unowned_partitions", "keylane_unowned_backlog_jobs", "keylane_dead_letters",
		"keylane_nats_connected", "keylane_oldest_waiting_job_age_seconds", "keylane_partition_lag_messages",
	} {
		if !used[must] {
			t.Errorf("the dashboard shows no %s", must)
		}
	}
}

// TestDashboardKeepsNamespacesApart: every query of a worker's series
// (all keylane_ series but the clients', which carry no namespace) selects
// the dashboard's $namespace, and no query sums by partition alone: the
// worker command labels its series with its namespace, and partition 3 of
// one namespace is not partition 3 of another. Failed before the
// dashboard had the variable: "keylane_jobs_succeeded_total does not
// select $namespace".
func TestDashboardKeepsNamespacesApart(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	worker := regexp.MustCompile(`\bkeylane_[a-z_]+(\{[^}]*\})?`)
	for _, q := range exprs(d) {
		if strings.HasPrefix(q, "label_values(") {
			continue
		}
		for _, m := range worker.FindAllStringSubmatch(q, -1) {
			if strings.HasPrefix(m[0], "keylane_client_") {
				continue
			}
			if !strings.Contains(m[1], `namespace=~"$namespace"`) {
				t.Errorf("%s does not select $namespace (in %s)", m[0], q)
			}
		}
		if strings.Contains(q, "by (partition)") {
			t.Errorf("%s sums by partition alone: add namespace", q)
		}
	}
	if !strings.Contains(string(raw), `"name": "namespace"`) {
		t.Error("the dashboard has no namespace variable")
	}
}
