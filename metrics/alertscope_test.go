package metrics

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// Every aggregation of docs/alerts.yml keeps the series of different
// namespaces apart: it groups by namespace (the namespace gauges) or by
// worker (a worker serves one namespace, and the per-worker metrics carry
// a namespace label only when the worker command exports them). A sum by partition alone adds partition 3 of one
// namespace to partition 3 of another: one namespace's steady backlog of
// 2000 and another's growing backlog of 10 page as one growing backlog
// of 2010.
func TestAlertAggregationsKeepNamespacesApart(t *testing.T) {
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range readRules(t, string(raw)) {
		for _, m := range promGroupLabel.FindAllStringSubmatch(r.expr, -1) {
			if m[1] != "by" {
				continue
			}
			var by []string
			for _, l := range strings.Split(m[2], ",") {
				by = append(by, strings.TrimSpace(l))
			}
			if !slices.Contains(by, "namespace") && !slices.Contains(by, "worker") {
				t.Errorf("%s aggregates by (%s): series of different namespaces are added together; group by worker or namespace too", r.alert, m[2])
			}
		}
	}
}
