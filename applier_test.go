package keylane

import (
	"context"
	"strings"
	"testing"
)

type nopApplier struct{}

func (nopApplier) ApplyGroup(context.Context, JobGroup) ([]JobOutcome, error) { return nil, nil }

// TestWorkerConfigOneRunner: NewWorker takes exactly one of Handler,
// Reducer and Applier, and says so. Fails if two (or none) are accepted.
func TestWorkerConfigOneRunner(t *testing.T) {
	h := HandlerFunc(func(context.Context, Job) ([]byte, error) { return nil, nil })
	r := ReducerFunc(func(context.Context, Job, []byte) ([]byte, []byte, error) { return nil, nil, nil })
	for name, cfg := range map[string]WorkerConfig{
		"none":            {},
		"handler+applier": {Handler: h, Applier: nopApplier{}},
		"reducer+applier": {Reducer: r, Applier: nopApplier{}},
		"handler+reducer": {Handler: h, Reducer: r},
		"all three":       {Handler: h, Reducer: r, Applier: nopApplier{}},
	} {
		err := cfg.setDefaults()
		if err == nil || !strings.Contains(err.Error(), "exactly one of Handler, Reducer and Applier") {
			t.Errorf("%s: %v, want the exactly-one error", name, err)
		}
	}
	cfg := WorkerConfig{Applier: nopApplier{}}
	if err := cfg.setDefaults(); err != nil {
		t.Errorf("applier alone: %v", err)
	}
}
