package keylane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/internal/testwait"
	"github.com/keylane/keylane/internal/tracing"
	"github.com/keylane/keylane/partition"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// recorder returns a tracer provider that records every span.
func recorder(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

func tracedClient(t *testing.T, e *env, tp trace.TracerProvider) *Client {
	t.Helper()
	c, err := NewClient(ctx(t), e.nc, ClientConfig{Namespace: e.ns, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func hasEvent(s sdktrace.ReadOnlySpan, name string) bool {
	for _, ev := range s.Events() {
		if ev.Name == name {
			return true
		}
	}
	return false
}

// ended returns the ended spans named name (and, if id is set, with that
// messaging.message.id).
func ended(rec *tracetest.SpanRecorder, name, id string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name && (id == "" || attr(s, "messaging.message.id") == id) {
			out = append(out, s)
		}
	}
	return out
}

// children returns the ended spans named name whose parent is p.
func children(rec *tracetest.SpanRecorder, p sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name && s.Parent().SpanID() == p.SpanContext().SpanID() && s.Parent().TraceID() == p.SpanContext().TraceID() {
			out = append(out, s)
		}
	}
	return out
}

// waitProcessed waits for the process span of job id to end, and returns it.
func waitProcessed(t *testing.T, rec *tracetest.SpanRecorder, ns, id string) sdktrace.ReadOnlySpan {
	t.Helper()
	testwait.Eventually(t, 10*time.Second, "process span of "+id, func() bool {
		return len(ended(rec, "keylane.process "+ns, id)) > 0
	})
	return ended(rec, "keylane.process "+ns, id)[0]
}

func oneSpan(t *testing.T, what string, ss []sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	if len(ss) != 1 {
		t.Fatalf("%d %s spans, want 1", len(ss), what)
	}
	return ss[0]
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := attr(s, k); got != v {
			t.Errorf("span %s: %s = %q, want %q", s.Name(), k, got, v)
		}
	}
}

func TestTracingCallJoinsTheCallersTrace(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	rec, tp := recorder(t)
	var runs atomic.Int64
	w := e.worker("w1", HandlerFunc(func(ctx context.Context, j Job) ([]byte, error) {
		runs.Add(1)
		_, span := tp.Tracer("shop").Start(ctx, "shop.reserve")
		defer span.End()
		switch {
		case string(j.Payload) == "flaky" && j.Attempt == 1:
			return nil, errors.New("flaky: try again")
		case string(j.Payload) == "bad":
			return nil, Permanent(errors.New("no such seat"))
		}
		return []byte("reserved"), nil
	}), func(c *WorkerConfig) { c.TracerProvider = tp })
	e.waitOwned(w)
	c := tracedClient(t, e, tp)

	rctx, root := tp.Tracer("test").Start(ctx(t), "http.request")
	res, err := c.Call(rctx, "seat:A7", []byte("flaky"), WithID("order-1"))
	root.End()
	if err != nil || string(res) != "reserved" {
		t.Fatalf("Call = %q, %v", res, err)
	}
	process := waitProcessed(t, rec, e.ns, "order-1")
	call := oneSpan(t, "call", ended(rec, "keylane.call "+e.ns, "order-1"))
	traceID := root.SpanContext().TraceID()

	// The client's span: a producer span under the caller's, with the
	// messaging attributes.
	if call.Parent().SpanID() != root.SpanContext().SpanID() || call.SpanKind() != trace.SpanKindProducer {
		t.Fatalf("call span: parent %v kind %v; want the caller's span %v, producer", call.Parent().SpanID(), call.SpanKind(), root.SpanContext().SpanID())
	}
	p := partition.Of("seat:A7", e.topo.Partitions)
	wantAttrs(t, call, map[string]string{
		"messaging.system": "nats", "messaging.operation.type": "send", "messaging.operation.name": "call",
		"messaging.destination.name": partition.Subject(e.ns, p, "seat:A7"), "messaging.destination.partition.id": fmt.Sprint(p),
		"messaging.message.id": "order-1", "keylane.key": "seat:A7",
	})
	if call.Status().Code == codes.Error {
		t.Errorf("call span status %v for a successful call", call.Status())
	}

	// The worker's span: a consumer span under the client's, same trace.
	if process.SpanContext().TraceID() != traceID || process.Parent().SpanID() != call.SpanContext().SpanID() {
		t.Fatalf("process span: trace %v parent %v; want trace %v under the call span %v", process.SpanContext().TraceID(), process.Parent().SpanID(), traceID, call.SpanContext().SpanID())
	}
	if process.SpanKind() != trace.SpanKindConsumer || process.Status().Code == codes.Error {
		t.Errorf("process span kind %v status %v", process.SpanKind(), process.Status())
	}
	wantAttrs(t, process, map[string]string{
		"messaging.system": "nats", "messaging.operation.type": "process", "messaging.message.id": "order-1",
		"messaging.destination.name": partition.Subject(e.ns, p, "seat:A7"), "messaging.consumer.group.name": fmt.Sprintf("p%d", p),
		"keylane.key": "seat:A7", "keylane.worker": "w1", "keylane.outcome": "acked", "keylane.attempts": "2",
	})
	if !hasEvent(process, "keylane.attempt_failed") {
		t.Errorf("process span has no keylane.attempt_failed event for the failed first attempt: %v", process.Events())
	}

	// Queue wait, then one run per attempt, then the commit, all children
	// of the process span, in that order.
	queue := oneSpan(t, "queue", children(rec, process, "keylane.queue"))
	runSpans := children(rec, process, "keylane.run")
	if len(runSpans) != 2 {
		t.Fatalf("%d run spans, want 2 (a failed attempt and its retry)", len(runSpans))
	}
	if runSpans[0].StartTime().After(runSpans[1].StartTime()) {
		runSpans[0], runSpans[1] = runSpans[1], runSpans[0]
	}
	commit := oneSpan(t, "commit", children(rec, process, "keylane.commit"))
	if !queue.StartTime().Equal(process.StartTime()) || queue.StartTime().Before(call.StartTime()) || queue.EndTime().After(runSpans[0].StartTime()) {
		t.Errorf("queue span %v–%v: want it from the job's stream timestamp (the process span's start %v, after the call's %v) to the first run %v",
			queue.StartTime(), queue.EndTime(), process.StartTime(), call.StartTime(), runSpans[0].StartTime())
	}
	for i, r := range runSpans {
		if got := attr(r, "keylane.attempt"); got != fmt.Sprint(i+1) {
			t.Errorf("run span %d: attempt %s", i, got)
		}
	}
	if runSpans[0].Status().Code != codes.Error || runSpans[1].Status().Code == codes.Error {
		t.Errorf("run span statuses %v, %v; want the failed attempt's an error", runSpans[0].Status(), runSpans[1].Status())
	}
	if commit.StartTime().Before(runSpans[1].EndTime()) || commit.EndTime().After(process.EndTime()) {
		t.Errorf("commit span %v–%v is not after the last run (ended %v) within the process span (ended %v)", commit.StartTime(), commit.EndTime(), runSpans[1].EndTime(), process.EndTime())
	}
	// The handler's own spans nest under the run that called it.
	for i, r := range runSpans {
		oneSpan(t, fmt.Sprintf("handler span of run %d", i+1), children(rec, r, "shop.reserve"))
	}

	// A job that is dead-lettered: the call and process spans are errors.
	_, err = c.Call(ctx(t), "seat:B1", []byte("bad"), WithID("order-2"))
	var re *RemoteError
	if !errors.As(err, &re) || !re.DeadLettered {
		t.Fatalf("Call of a permanently failing job = %v, want a dead-lettered RemoteError", err)
	}
	process = waitProcessed(t, rec, e.ns, "order-2")
	call = oneSpan(t, "call", ended(rec, "keylane.call "+e.ns, "order-2"))
	if call.Status().Code != codes.Error || attr(call, "keylane.remote.dead_lettered") != "true" {
		t.Errorf("call span of a dead-lettered job: status %v, dead_lettered %q", call.Status(), attr(call, "keylane.remote.dead_lettered"))
	}
	if process.Status().Code != codes.Error || attr(process, "keylane.outcome") != "dead_lettered" || !hasEvent(process, "keylane.dead_lettered") {
		t.Errorf("process span of a dead-lettered job: status %v, outcome %q, events %v", process.Status(), attr(process, "keylane.outcome"), process.Events())
	}
	testwait.Eventually(t, 10*time.Second, "every span ended", func() bool {
		return len(rec.Started()) == len(rec.Ended())
	})
}

func TestTracingGroupCommitOneSpanPerGroup(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	rec, tp := recorder(t)
	started, gate := make(chan struct{}, 1), make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	defer release()
	count := ReducerFunc(func(ctx context.Context, j Job, state []byte) ([]byte, []byte, error) {
		_, span := tp.Tracer("shop").Start(ctx, "shop.count")
		span.End()
		if string(j.Payload) == "first" {
			select {
			case started <- struct{}{}:
			default:
			}
			<-gate
		}
		next := append(append([]byte(nil), state...), 'x')
		return next, next, nil
	})
	logs := &logRecorder{}
	w := e.worker("w1", nil, func(c *WorkerConfig) {
		c.Handler, c.Reducer, c.TracerProvider, c.Logger = nil, count, tp, logs.logger()
	})
	e.waitOwned(w)
	c := tracedClient(t, e, tp)

	// The first job holds the key's runner while four more queue up
	// behind it; those four are then reduced and committed together.
	ids := []string{"j1", "j2", "j3", "j4", "j5"}
	if _, err := c.Submit(ctx(t), "sku:1", []byte("first"), WithID(ids[0])); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx(t).Done():
		t.Fatal("the first job never ran")
	}
	for _, id := range ids[1:] {
		if _, err := c.Submit(ctx(t), "sku:1", []byte(id), WithID(id)); err != nil {
			t.Fatal(err)
		}
	}
	p := partition.Of("sku:1", e.topo.Partitions)
	cons, err := e.js.Consumer(ctx(t), e.topo.Names.Jobs(), e.topo.Names.Consumer(p))
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "all five jobs delivered to the worker", func() bool {
		info, err := cons.Info(ctx(t))
		return err == nil && info.NumAckPending == 5
	})
	// Delivered is not yet queued in the lane (see TestTracingFailedGroupWrite).
	testwait.Eventually(t, 10*time.Second, "the four queued in their lane", func() bool {
		for _, id := range ids[1:] {
			if !logs.received(id) {
				return false
			}
		}
		return true
	})
	release()

	// Every job: a process span with a run span (the reducer's own span
	// under it) and exactly one commit, as the commit span's parent or
	// linked to it. Commit spans cover the five jobs once, and one covers
	// several.
	commits := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	processOf := map[trace.SpanID]string{}
	for _, id := range ids {
		pr := waitProcessed(t, rec, e.ns, id)
		processOf[pr.SpanContext().SpanID()] = id
		if attr(pr, "keylane.outcome") != "acked" {
			t.Errorf("job %s: outcome %q", id, attr(pr, "keylane.outcome"))
		}
		run := oneSpan(t, "run of "+id, children(rec, pr, "keylane.run"))
		oneSpan(t, "reducer span of "+id, children(rec, run, "shop.count"))
		own := children(rec, pr, "keylane.commit")
		links := pr.Links()
		if len(own)+len(links) != 1 {
			t.Fatalf("job %s has %d commit spans and %d links; want exactly one commit", id, len(own), len(links))
		}
		for _, s := range own {
			commits[s.SpanContext().SpanID()] = s
		}
	}
	covered := 0
	grouped := false
	for _, cs := range commits {
		n := 1 + len(cs.Links())
		if attr(cs, "keylane.group.size") != fmt.Sprint(n) {
			t.Errorf("commit span: group size %s, %d links", attr(cs, "keylane.group.size"), len(cs.Links()))
		}
		for _, l := range cs.Links() {
			if processOf[l.SpanContext.SpanID()] == "" {
				t.Errorf("commit span links to %v, not a job's process span", l.SpanContext.SpanID())
			}
		}
		covered += n
		grouped = grouped || n > 1
	}
	if covered != len(ids) || !grouped {
		t.Fatalf("%d commit spans cover %d jobs (grouped: %v); want %d jobs, some in one group", len(commits), covered, grouped, len(ids))
	}
	for _, id := range ids {
		pr := waitProcessed(t, rec, e.ns, id)
		for _, l := range pr.Links() {
			if _, ok := commits[l.SpanContext.SpanID()]; !ok {
				t.Errorf("job %s links to %v, not a commit span", id, l.SpanContext.SpanID())
			}
		}
	}
	testwait.Eventually(t, 10*time.Second, "every span ended", func() bool {
		return len(rec.Started()) == len(rec.Ended())
	})
}

// TestTracingFailedGroupWrite: a group whose compare-and-set fails (the
// test rewrites the key's state, same bytes, new revision, while the
// group reduces) shows as a commit span with an error status covering the
// group; the job the group put back in its lane ends its first span as
// requeued and gets a second when it runs again; no span stays open.
func TestTracingFailedGroupWrite(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	rec, tp := recorder(t)
	type gate struct {
		started chan struct{}
		release chan struct{}
		once    atomic.Bool
	}
	gates := map[string]*gate{}
	for _, p := range []string{"first", "b2"} {
		gates[p] = &gate{started: make(chan struct{}), release: make(chan struct{})}
	}
	for _, g := range gates {
		defer func() {
			select {
			case <-g.release:
			default:
				close(g.release)
			}
		}()
	}
	count := ReducerFunc(func(ctx context.Context, j Job, state []byte) ([]byte, []byte, error) {
		if g := gates[string(j.Payload)]; g != nil && g.once.CompareAndSwap(false, true) {
			close(g.started)
			<-g.release
		}
		next := append(append([]byte(nil), state...), 'x')
		return next, next, nil
	})
	logs := &logRecorder{}
	w := e.worker("w1", nil, func(c *WorkerConfig) {
		c.Handler, c.Reducer, c.TracerProvider, c.Logger = nil, count, tp, logs.logger()
	})
	e.waitOwned(w)
	c := tracedClient(t, e, tp)
	wait := func(ch chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-ctx(t).Done():
			t.Fatal(what)
		}
	}
	if _, err := c.Call(ctx(t), "sku:1", []byte("init")); err != nil {
		t.Fatal(err)
	}
	// b1 and b2 queue behind "first", then run as one group.
	for _, id := range []string{"first", "b1", "b2"} {
		if _, err := c.Submit(ctx(t), "sku:1", []byte(id), WithID(id)); err != nil {
			t.Fatal(err)
		}
		if id == "first" {
			wait(gates["first"].started, "the first job never ran")
		}
	}
	p := partition.Of("sku:1", e.topo.Partitions)
	cons, err := e.js.Consumer(ctx(t), e.topo.Names.Jobs(), e.topo.Names.Consumer(p))
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "b1 and b2 delivered", func() bool {
		info, err := cons.Info(ctx(t))
		return err == nil && info.NumAckPending == 3
	})
	// Delivered to the connection is not yet queued in the lane: a runner
	// that took the next group before b2 was queued ran b1 alone, and b2's
	// failed write then made one process span, not two (a loaded CI run).
	testwait.Eventually(t, 10*time.Second, "b1 and b2 queued in their lane", func() bool {
		return logs.received("b1") && logs.received("b2")
	})
	close(gates["first"].release)
	// While the group reduces b2, move the key's revision on: its write fails.
	wait(gates["b2"].started, "b2 never ran")
	entry, err := e.topo.State.Get(ctx(t), StateKey("sku:1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.topo.State.Put(ctx(t), StateKey("sku:1"), entry.Value()); err != nil {
		t.Fatal(err)
	}
	close(gates["b2"].release)

	b1 := waitProcessed(t, rec, e.ns, "b1")
	testwait.Eventually(t, 10*time.Second, "b2's second process span", func() bool {
		return len(ended(rec, "keylane.process "+e.ns, "b2")) == 2
	})
	b2 := ended(rec, "keylane.process "+e.ns, "b2")
	if attr(b2[0], "keylane.outcome") != "requeued" || attr(b2[1], "keylane.outcome") != "acked" || attr(b1, "keylane.outcome") != "acked" {
		t.Fatalf("outcomes: b1 %q, b2 %q then %q; want acked, requeued then acked",
			attr(b1, "keylane.outcome"), attr(b2[0], "keylane.outcome"), attr(b2[1], "keylane.outcome"))
	}
	failed := oneSpan(t, "failed commit", children(rec, b2[0], "keylane.commit"))
	if failed.Status().Code != codes.Error || attr(failed, "keylane.group.size") != "2" ||
		len(failed.Links()) != 1 || failed.Links()[0].SpanContext.SpanID() != b1.SpanContext().SpanID() {
		t.Fatalf("failed group commit span: status %v, group size %s, links %v; want an error covering b1 and b2",
			failed.Status(), attr(failed, "keylane.group.size"), failed.Links())
	}
	// b1 was then settled alone, with a commit of its own.
	if cs := children(rec, b1, "keylane.commit"); len(cs) != 1 || cs[0].Status().Code == codes.Error {
		t.Fatalf("b1's own commit spans: %v", cs)
	}
	testwait.Eventually(t, 10*time.Second, "every span ended", func() bool {
		return len(rec.Started()) == len(rec.Ended())
	})
}

// traceparentOf returns the traceparent header stored with job id (a
// one-job message's header, or the one a batch body carries for the job),
// and whether it had one (in any case).
func traceparentOf(t *testing.T, e *env, id string) (string, bool) {
	t.Helper()
	for _, j := range storedJobs(t, e.js, e.topo.Names.Jobs()) {
		if j.ID != id {
			continue
		}
		for k, v := range j.Header {
			if strings.EqualFold(k, "traceparent") {
				return v[0], true
			}
		}
		return "", false
	}
	t.Fatalf("job %s not stored", id)
	return "", false
}

func TestTracingHeaderOnlyWhenConfigured(t *testing.T) {
	// A global provider and propagator are set, as an application's
	// main might; keylane must not use them unless given them.
	globalRec, globalTP := recorder(t)
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(globalTP)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	e := newEnv(t, TopologyConfig{})
	rec, tp := recorder(t)
	traced := tracedClient(t, e, tp)
	// No worker yet: the jobs stay in the stream to be looked at.
	gctx, parent := globalTP.Tracer("test").Start(ctx(t), "http.request")
	if _, err := e.client.Submit(gctx, "k", []byte("plain"), WithID("plain-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := traced.Submit(ctx(t), "k", []byte("traced"), WithID("traced-1")); err != nil {
		t.Fatal(err)
	}
	out, err := traced.SubmitMany(ctx(t), []Request{{Key: "k", ID: "many-1"}, {Key: "k2", ID: "many-2"}})
	if err != nil || out[0].Err != nil || out[1].Err != nil {
		t.Fatalf("SubmitMany = %v, %v", out, err)
	}
	parent.End()

	if tp, ok := traceparentOf(t, e, "plain-1"); ok {
		t.Errorf("a client without tracing sent traceparent %q", tp)
	}
	submit := oneSpan(t, "submit", ended(rec, "keylane.submit "+e.ns, "traced-1"))
	sc := submit.SpanContext()
	if got, _ := traceparentOf(t, e, "traced-1"); got != fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()) {
		t.Errorf("traced submit stored traceparent %q, want the submit span's %v/%v", got, sc.TraceID(), sc.SpanID())
	}
	many := oneSpan(t, "submit_many", ended(rec, "keylane.submit_many "+e.ns, ""))
	for _, id := range []string{"many-1", "many-2"} {
		sc := many.SpanContext()
		if got, _ := traceparentOf(t, e, id); got != fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()) {
			t.Errorf("SubmitMany stored traceparent %q on %s, want the batch span's %v/%v", got, id, sc.TraceID(), sc.SpanID())
		}
	}

	// A worker without tracing runs them all and records nothing.
	var runs atomic.Int64
	w := e.worker("w1", HandlerFunc(func(context.Context, Job) ([]byte, error) { runs.Add(1); return nil, nil }), nil)
	e.waitOwned(w)
	if _, err := e.client.Call(gctx, "k", nil); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, "all jobs run", func() bool { return runs.Load() == 5 })
	if n := len(globalRec.Started()); n != 1 { // the test's own parent span
		for _, s := range globalRec.Started() {
			t.Logf("span %s", s.Name())
		}
		t.Fatalf("%d spans on the global provider; keylane started some without being configured", n-1)
	}
	for _, s := range rec.Started() {
		if strings.HasPrefix(s.Name(), "keylane.process") {
			t.Fatalf("a worker without a TracerProvider recorded %s", s.Name())
		}
	}
}

// TestTracingOffAllocatesNothing: with tracing off every hook is a nil
// check (the worker's: internal/tenure's TestTracingOffAllocatesNothing).
func TestTracingOffAllocatesNothing(t *testing.T) {
	var ct *tracing.Client
	m := &nats.Msg{Subject: "keylane.jobs.0", Header: nats.Header{HeaderJobID: {"a"}}}
	c := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		ct.Send(c, "submit", m).End(&err)
		batch := ct.SendMany(c, 2)
		batch.Inject(m)
		batch.End(0, func(int) error { return nil })
	})
	if allocs != 0 {
		t.Fatalf("tracing off allocates %v times per job", allocs)
	}
	if len(m.Header) != 1 {
		t.Fatalf("tracing off wrote headers: %v", m.Header)
	}
}

func TestTracingBadTraceparentIsIgnored(t *testing.T) {
	e := newEnv(t, TopologyConfig{})
	rec, tp := recorder(t)
	w := e.worker("w1", echo(), func(c *WorkerConfig) { c.TracerProvider = tp })
	e.waitOwned(w)
	for i, bad := range []string{
		"garbage",
		"00-00000000000000000000000000000000-0000000000000000-01", // all-zero IDs are invalid
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",    // no flags
		strings.Repeat("z", 4096),
	} {
		id := fmt.Sprintf("bad-%d", i)
		// The client has no tracing: the header goes as given.
		res, err := e.client.Call(ctx(t), "k", []byte("x"), WithID(id), WithHeader("traceparent", bad))
		if err != nil || string(res) != "done x" {
			t.Fatalf("job with traceparent %.40q: %q, %v", bad, res, err)
		}
		pr := waitProcessed(t, rec, e.ns, id)
		if pr.Parent().IsValid() || attr(pr, "keylane.outcome") != "acked" {
			t.Errorf("job with traceparent %.40q: process span parent %v, outcome %q; want a root span, acked", bad, pr.Parent(), attr(pr, "keylane.outcome"))
		}
	}
	// A well-formed one from a producer that capitalises it is honoured.
	res, err := e.client.Call(ctx(t), "k", []byte("y"), WithID("good"), WithHeader("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
	if err != nil || string(res) != "done y" {
		t.Fatalf("Call = %q, %v", res, err)
	}
	if pr := waitProcessed(t, rec, e.ns, "good"); pr.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || pr.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("process span parent %v, want the sent traceparent's", pr.Parent())
	}
}

// BenchmarkCallTracing measures a Call's round trip through a real
// in-process server and worker with tracing off and on (an SDK provider
// that samples every span and exports none: the instrumentation's cost).
func BenchmarkCallTracing(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			srv := natstest.Start(b)
			nc := natstest.Connect(b, srv)
			var tp trace.TracerProvider
			if on {
				sdk := sdktrace.NewTracerProvider()
				b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
				tp = sdk
			}
			bctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			w, err := NewWorker(nc, WorkerConfig{Topology: TopologyConfig{Partitions: 4, LeaseTTL: time.Second}, Handler: echo(), TracerProvider: tp})
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Start(bctx); err != nil {
				b.Fatal(err)
			}
			defer w.Stop(bctx)
			c, err := NewClient(bctx, nc, ClientConfig{TracerProvider: tp})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			testwait.Eventually(b, 10*time.Second, "partitions owned", func() bool { return len(w.Owned()) == 4 })
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Call(bctx, "k", []byte("x")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
