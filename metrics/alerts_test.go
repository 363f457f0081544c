package metrics

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// alertsFile is the Prometheus rule file shipped in the repository.
const alertsFile = "../docs/alerts.yml"

// oncallFile is the page the rules' runbook links point into.
const oncallFile = "../docs/oncall.md"

// alertRule is one alerting rule of the rule file.
type alertRule struct {
	alert, expr, forDur, severity, summary, runbook string
}

// readRules reads the rule file's alerting rules. The file keeps to a
// plain subset of YAML (promtool is not at hand, and keylane's module has
// no YAML library): "- alert:" starts a rule, and its expr, for,
// severity, summary and runbook are one-line "key: value" entries (a
// value may be quoted).
func readRules(t *testing.T, raw string) []alertRule {
	t.Helper()
	var rules []alertRule
	unquote := func(v string) string {
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
			return v[1 : len(v)-1]
		}
		return v
	}
	for i, line := range strings.Split(raw, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if strings.HasPrefix(line, "\t") {
			t.Fatalf("%s:%d: a tab in the indentation", alertsFile, i+1)
		}
		if a, ok := strings.CutPrefix(trimmed, "- alert:"); ok {
			rules = append(rules, alertRule{alert: unquote(a)})
			continue
		}
		key, v, ok := strings.Cut(trimmed, ":")
		if !ok || len(rules) == 0 {
			continue
		}
		r := &rules[len(rules)-1]
		v = unquote(v)
		switch key {
		case "expr":
			if v == "|" || v == ">" || v == "|-" || v == ">-" {
				t.Fatalf("%s:%d: write %s's expr on one line", alertsFile, i+1, r.alert)
			}
			r.expr = v
		case "for":
			r.forDur = v
		case "severity":
			r.severity = v
		case "summary":
			r.summary = v
		case "runbook":
			r.runbook = v
		}
	}
	return rules
}

var (
	promMatchers   = regexp.MustCompile(`\{([^}]*)\}`)
	promMatcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promGroupLabel = regexp.MustCompile(`\b(by|without|on|ignoring)\s*\(([^)]*)\)`)
	templateLabel  = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	mdHeading      = regexp.MustCompile(`(?m)^#+\s+(.+)$`)
)

// Every rule of docs/alerts.yml is complete (an expression, a severity,
// a summary, a runbook link into docs/oncall.md that exists); every
// metric its expression names is exported by a worker that ran real jobs
// against a real server, and every label it matches on or groups by, or
// its annotations print, is one those metrics carry. Renaming a metric or
// a label without the rules (or the reverse) fails here.
func TestAlertRulesUseExportedMetricsAndLabels(t *testing.T) {
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(strings.TrimSpace(strings.SplitN(string(raw), "\ngroups:", 2)[1]), "- name:") {
		t.Fatalf("%s: want groups: followed by a named group", alertsFile)
	}
	rules := readRules(t, string(raw))
	if len(rules) < 6 {
		t.Fatalf("%s has %d rules, want at least 6", alertsFile, len(rules))
	}
	doc, err := os.ReadFile(oncallFile)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(string(doc), -1) {
		anchors[strings.ToLower(strings.Join(strings.Fields(strings.Trim(m[1], "`")), "-"))] = true
	}

	labels := map[string]map[string]bool{} // by metric: its label names
	for name, mf := range exportedFamilies(t) {
		labels[name] = map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels[name][lp.GetName()] = true
			}
		}
	}

	seen := map[string]bool{}
	for _, r := range rules {
		t.Run(r.alert, func(t *testing.T) {
			if r.alert == "" || !strings.HasPrefix(r.alert, "Keylane") || seen[r.alert] {
				t.Errorf("alert name %q: want a unique Keylane… name", r.alert)
			}
			seen[r.alert] = true
			if r.expr == "" || r.summary == "" {
				t.Fatalf("%s has no expr or no summary", r.alert)
			}
			if r.severity != "page" && r.severity != "ticket" {
				t.Errorf("%s: severity %q, want page or ticket", r.alert, r.severity)
			}
			anchor, ok := strings.CutPrefix(r.runbook, "docs/oncall.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("%s: runbook %q is not a heading of %s", r.alert, r.runbook, oncallFile)
			}
			names := metricNames(r.expr)
			if len(names) == 0 {
				t.Fatalf("%s selects no metric: %s", r.alert, r.expr)
			}
			have := map[string]bool{}
			for _, n := range names {
				if labels[n] == nil {
					t.Errorf("%s names %s, which keylane does not export", r.alert, n)
				}
				for l := range labels[n] {
					have[l] = true
				}
			}
			var used []string
			for _, m := range promMatchers.FindAllStringSubmatch(r.expr, -1) {
				for _, l := range promMatcher.FindAllStringSubmatch(m[1], -1) {
					used = append(used, l[1])
				}
			}
			var by []string
			for _, m := range promGroupLabel.FindAllStringSubmatch(r.expr, -1) {
				for _, l := range strings.Split(m[2], ",") {
					if l = strings.TrimSpace(l); l != "" {
						used = append(used, l)
						if m[1] == "by" {
							by = append(by, l)
						}
					}
				}
			}
			for _, l := range used {
				if !have[l] {
					t.Errorf("%s uses label %q, which none of %q carries", r.alert, l, names)
				}
			}
			// The annotations print labels the alert keeps: those it
			// groups by, or, without a by, the metrics' own.
			for _, m := range templateLabel.FindAllStringSubmatch(r.summary, -1) {
				if len(by) > 0 && !slices.Contains(by, m[1]) || len(by) == 0 && !have[m[1]] {
					t.Errorf("%s's summary prints $labels.%s, which its result does not carry", r.alert, m[1])
				}
			}
		})
	}
	for _, must := range []string{"keylane_dead_letters", "keylane_unowned_partitions", "keylane_namespace_workers", "keylane_oldest_waiting_job_timestamp_seconds", "keylane_nats_connected", "keylane_lease_renew_failures_total", "keylane_partition_backlog"} {
		found := false
		for _, r := range rules {
			found = found || slices.Contains(metricNames(r.expr), must)
		}
		if !found {
			t.Errorf("no rule watches %s", must)
		}
	}
}
