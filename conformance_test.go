package keylane

// The shared conformance vectors (testdata/conformance, described in its
// README.md and in PROTOCOL.md): every vector is made here by the real
// code — the client's message builder on a real server's namespace,
// package wire's encoders and rules, package partition's hash, the reply
// and kept-outcome codecs — and each file must equal what the code makes
// now, so the files other languages' clients test against cannot drift
// from the Go code. KEYLANE_UPDATE_VECTORS=1 (or -update-vectors)
// rewrites them.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/keylane/keylane/internal/natserr"
	"github.com/keylane/keylane/internal/natstest"
	"github.com/keylane/keylane/partition"
	"github.com/keylane/keylane/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var updateVectors = flag.Bool("update-vectors", false, "rewrite testdata/conformance from the code")

const (
	conformanceDir  = "testdata/conformance"
	protocolVersion = "keylane wire protocol v1"
)

// hdrs is a header set as the vectors write it: name → values.
type hdrs map[string][]string

func hx(b []byte) string { return hex.EncodeToString(b) }

func TestConformanceVectors(t *testing.T) {
	gen := newConformanceGen(t)
	files := map[string]any{
		"keys.json":       gen.keys(),
		"validation.json": gen.validation(),
		"jobs.json":       gen.jobs(),
		"batches.json":    gen.batches(),
		"outcomes.json":   gen.outcomes(),
		"replies.json":    gen.replies(),
		"refusals.json":   gen.refusals(),
		"streams.json":    gen.streams(),
		"delays.json":     gen.delays(),
	}
	update := *updateVectors || os.Getenv("KEYLANE_UPDATE_VECTORS") == "1"
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(files[name]); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(conformanceDir, name)
		if update {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (KEYLANE_UPDATE_VECTORS=1 writes it)", err)
		}
		if !bytes.Equal(want, buf.Bytes()) {
			t.Errorf("%s differs from what the code produces:\n%s(KEYLANE_UPDATE_VECTORS=1 rewrites it from the code; review the diff)", path, vectorDiff(want, buf.Bytes()))
		}
	}
}

// vectorDiff names the vectors that differ between two files' JSON.
func vectorDiff(want, got []byte) string {
	var w, g map[string]any
	if json.Unmarshal(want, &w) != nil || json.Unmarshal(got, &g) != nil {
		return "  (the file is not valid JSON)\n"
	}
	var b strings.Builder
	for k, gv := range g {
		ga, ok1 := gv.([]any)
		wa, ok2 := w[k].([]any)
		if !ok1 || !ok2 {
			if !reflect.DeepEqual(gv, w[k]) {
				fmt.Fprintf(&b, "  field %q: file %v, code %v\n", k, w[k], gv)
			}
			continue
		}
		byName := func(a []any) map[string]any {
			m := map[string]any{}
			for _, v := range a {
				if o, ok := v.(map[string]any); ok {
					m[fmt.Sprint(o["name"])] = o
				}
			}
			return m
		}
		wm, gm := byName(wa), byName(ga)
		for n, gv := range gm {
			wv, ok := wm[n]
			switch {
			case !ok:
				fmt.Fprintf(&b, "  %s: vector %q missing from the file\n", k, n)
			case !reflect.DeepEqual(wv, gv):
				wj, _ := json.Marshal(wv)
				gj, _ := json.Marshal(gv)
				fmt.Fprintf(&b, "  %s: vector %q:\n    file: %s\n    code: %s\n", k, n, wj, gj)
			}
		}
		for n := range wm {
			if _, ok := gm[n]; !ok {
				fmt.Fprintf(&b, "  %s: vector %q in the file, not made by the code\n", k, n)
			}
		}
		if len(wa) != len(ga) && b.Len() == 0 {
			fmt.Fprintf(&b, "  %s: %d vectors in the file, %d made by the code (names repeated?)\n", k, len(wa), len(ga))
		}
	}
	for k := range w {
		if _, ok := g[k]; !ok {
			fmt.Fprintf(&b, "  field %q in the file, not made by the code\n", k)
		}
	}
	if b.Len() == 0 {
		b.WriteString("  (same vectors; formatting or order differs)\n")
	}
	return b.String()
}

// conformanceGen makes the vectors; its clients are real clients of
// namespaces on a real server.
type conformanceGen struct {
	t       *testing.T
	js      jetstream.JetStream
	clients map[string]*Client
	topos   map[string]*Topology
}

// The namespaces the vectors use.
var conformanceNamespaces = []TopologyConfig{
	{Namespace: "keylane", Partitions: 4},
	{Namespace: "orders-eu", Partitions: 8, StreamShards: 2},
	{Namespace: "shop", Partitions: 16, ReplyPrefix: "replies."},
	{Namespace: "timers", Partitions: 4, StreamShards: 2, Delays: true},
}

func newConformanceGen(t *testing.T) *conformanceGen {
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	g := &conformanceGen{t: t, js: js, clients: map[string]*Client{}, topos: map[string]*Topology{}}
	for _, tc := range conformanceNamespaces {
		tc.LeaseTTL = time.Second
		topo, err := Setup(ctx(t), js, tc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewClient(ctx(t), nc, ClientConfig{Namespace: tc.Namespace})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		g.clients[tc.Namespace], g.topos[tc.Namespace] = c, topo
	}
	return g
}

// ---- keys.json

var conformancePartitionCounts = []int{1, 2, 3, 4, 7, 8, 16, 64, 100, 256, 1000, 4096}

type keyVector struct {
	Name        string         `json:"name"`
	Key         string         `json:"key"`
	KeyHex      string         `json:"key_hex"`
	XXHash64Hex string         `json:"xxhash64_hex"`
	XXHash64Dec string         `json:"xxhash64_dec"`
	Token       string         `json:"token"`
	Partitions  []partitionOfN `json:"partitions"`
}

type partitionOfN struct {
	Count     int `json:"count"`
	Partition int `json:"partition"`
}

func (g *conformanceGen) keys() any {
	keys := []struct{ name, key string }{
		{"ascii-single-letter", "a"},
		{"ascii-digit", "0"},
		{"ascii-order", "order-1"},
		{"ascii-customer", "customer:42"},
		{"ascii-dots", "user.7.cart"},
		{"ascii-inner-space", "sku 1234 blue"},
		{"ascii-wildcard-star", "*"},
		{"ascii-wildcard-gt", ">"},
		{"ascii-quotes-backslash", `say "hi"\`},
		{"ascii-json-like", `{"tenant":"acme","id":7}`},
		{"utf8-2-byte", "ü"},
		{"utf8-latin", "naïve café"},
		{"utf8-nfc-e-acute", "\u00e9"},
		{"utf8-nfd-e-acute", "e\u0301"},
		{"utf8-3-byte-cjk", "日本語キー"},
		{"utf8-4-byte-emoji", "🔑key"},
		{"utf8-rtl", "مفتاح"},
		{"utf8-inner-nbsp", "a\u00a0b"},
		{"utf8-zero-width-joiner", "a\u200db"},
		{"max-length-ascii", strings.Repeat("k", partition.MaxKeyLen)},
		{"max-length-2-byte", strings.Repeat("é", partition.MaxKeyLen/2)},
		{"max-length-3-byte-plus-ascii", strings.Repeat("語", partition.MaxKeyLen/3) + "x"},
		{"max-length-4-byte", strings.Repeat("🔑", partition.MaxKeyLen/4)},
	}
	var out []keyVector
	for _, k := range keys {
		if err := wire.ValidateKey(k.key); err != nil {
			g.t.Fatalf("key vector %s: %v", k.name, err)
		}
		h := xxhash.Sum64String(k.key)
		v := keyVector{Name: k.name, Key: k.key, KeyHex: hx([]byte(k.key)), XXHash64Hex: fmt.Sprintf("%016x", h), XXHash64Dec: strconv.FormatUint(h, 10), Token: partition.KeyToken(k.key)}
		if v.Token != v.XXHash64Hex {
			g.t.Fatalf("key %s: token %s is not the hash %s", k.name, v.Token, v.XXHash64Hex)
		}
		for _, n := range conformancePartitionCounts {
			v.Partitions = append(v.Partitions, partitionOfN{n, partition.Of(k.key, n)})
		}
		out = append(out, v)
	}
	return map[string]any{"protocol": protocolVersion, "hash": partition.HashName, "vectors": out}
}

// ---- validation.json

type validationVector struct {
	Name        string `json:"name"`
	Field       string `json:"field"`
	Value       string `json:"value"`
	ValueHex    string `json:"value_hex"`
	HeaderValue string `json:"header_value"`
	ReplyPrefix string `json:"reply_prefix"`
	Valid       bool   `json:"valid"`
	Error       string `json:"error"`
}

func (g *conformanceGen) validation() any {
	var out []validationVector
	add := func(name, field, value string, err error) {
		v := validationVector{Name: name, Field: field, ValueHex: hx([]byte(value)), Valid: err == nil}
		if utf8Valid(value) {
			v.Value = value
		}
		if err != nil {
			v.Error = err.Error()
		}
		out = append(out, v)
	}
	for _, c := range []struct{ name, v string }{
		{"key-ok-ascii", "order-1"},
		{"key-ok-inner-space", "a b"},
		{"key-ok-max-length", strings.Repeat("k", partition.MaxKeyLen)},
		{"key-empty", ""},
		{"key-too-long", strings.Repeat("k", partition.MaxKeyLen+1)},
		{"key-too-long-multibyte", strings.Repeat("é", partition.MaxKeyLen/2) + "x"},
		{"key-not-utf8", "a\xffb"},
		{"key-nul", "a\x00b"},
		{"key-tab", "a\tb"},
		{"key-lf", "a\nb"},
		{"key-cr", "a\rb"},
		{"key-del", "a\x7fb"},
		{"key-c1-nel", "a\u0085b"},
		{"key-leading-space", " order-1"},
		{"key-trailing-space", "order-1 "},
		{"key-leading-nbsp", "\u00a0order-1"},
		{"key-trailing-ideographic-space", "order-1\u3000"},
	} {
		add(c.name, "key", c.v, wire.ValidateKey(c.v))
	}
	for _, c := range []struct{ name, v string }{
		{"job-id-ok", "order-17"},
		{"job-id-ok-dots", "order.1.a"},
		{"job-id-ok-all-classes", "A_b=c-9.Z"},
		{"job-id-ok-batched", "Gj2Qhk3TYhYAmoxTQJcHq0.17"},
		{"job-id-ok-max-length", strings.Repeat("x", wire.MaxJobIDLen)},
		{"job-id-empty", ""},
		{"job-id-too-long", strings.Repeat("x", wire.MaxJobIDLen+1)},
		{"job-id-double-dot", "order..1"},
		{"job-id-leading-dot", ".order"},
		{"job-id-trailing-dot", "order."},
		{"job-id-space", "order 1"},
		{"job-id-star", "order*"},
		{"job-id-gt", "order>"},
		{"job-id-slash", "a/b"},
		{"job-id-tilde", "a~b"},
		{"job-id-colon", "a:b"},
		{"job-id-non-ascii", "ordér"},
	} {
		add(c.name, "job_id", c.v, wire.ValidateJobID(c.v))
	}
	for _, c := range []struct{ name, v string }{
		{"type-ok-empty", ""},
		{"type-ok", "reserve"},
		{"type-ok-utf8", "réserver stock"},
		{"type-ok-max-length", strings.Repeat("t", wire.MaxTypeLen)},
		{"type-too-long", strings.Repeat("t", wire.MaxTypeLen+1)},
		{"type-leading-space", " reserve"},
		{"type-trailing-newline", "reserve\n"},
		{"type-control", "re\x01serve"},
		{"type-not-utf8", "\xff"},
	} {
		add(c.name, "type", c.v, wire.ValidateType(c.v))
	}
	for _, c := range []struct{ name, h, v string }{
		{"header-ok", "X-Tenant", "acme"},
		{"header-ok-traceparent", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"header-ok-empty-value", "X-Empty", ""},
		{"header-ok-utf8-value", "X-Note", "café"},
		{"header-reserved-nats", "Nats-Rollup", "sub"},
		{"header-reserved-nats-lowercase", "nats-msg-id", "x"},
		{"header-reserved-keylane", "Keylane-Redrive-Of", "x"},
		{"header-reserved-keylane-uppercase", "KEYLANE-KEY", "x"},
		{"header-reserved-status", "Status", "503"},
		{"header-reserved-description", "description", "x"},
		{"header-name-empty", "", "x"},
		{"header-name-space", "X Tenant", "x"},
		{"header-name-colon", "X:Tenant", "x"},
		{"header-name-non-ascii", "X-Café", "x"},
		{"header-name-too-long", strings.Repeat("h", wire.MaxHeaderNameLen+1), "x"},
		{"header-value-crlf", "X-Tenant", "a\r\nb"},
		{"header-value-nul", "X-Tenant", "a\x00b"},
		{"header-value-leading-space", "X-Tenant", " acme"},
		{"header-value-trailing-tab", "X-Tenant", "acme\t"},
	} {
		err := wire.ValidateUserHeader(c.h, c.v)
		add(c.name, "header", c.h, err)
		out[len(out)-1].HeaderValue = c.v
	}
	for _, c := range []struct{ name, prefix, v string }{
		{"reply-ok", "_INBOX.", "_INBOX.Vx3kQ2.-1"},
		{"reply-ok-other-prefix", "replies.", "replies.client7.-a"},
		{"reply-just-the-prefix", "_INBOX.", "_INBOX."},
		{"reply-outside-prefix", "_INBOX.", "$JS.API.STREAM.DELETE.KEYLANE_JOBS"},
		{"reply-namespace-subject", "_INBOX.", "keylane.jobs.0.batch"},
		{"reply-empty-token", "_INBOX.", "_INBOX.a..b"},
		{"reply-trailing-dot", "_INBOX.", "_INBOX.a."},
		{"reply-star", "_INBOX.", "_INBOX.*"},
		{"reply-gt", "_INBOX.", "_INBOX.a.>"},
		{"reply-space", "_INBOX.", "_INBOX.a b"},
	} {
		add(c.name, "reply", c.v, wire.ValidateReply(c.v, c.prefix))
		out[len(out)-1].ReplyPrefix = c.prefix
	}
	for _, c := range []struct{ name, v string }{
		{"batch-id-ok", "Gj2Qhk3TYhYAmoxTQJcHq0"},
		{"batch-id-too-short", "Gj2Qhk3TYhYAmoxTQJcHq"},
		{"batch-id-too-long", "Gj2Qhk3TYhYAmoxTQJcHq00"},
		{"batch-id-dash", "Gj2Qhk3TYhYAmoxTQJc-q0"},
	} {
		var err error
		if !wire.ValidBatchID(c.v) {
			err = fmt.Errorf("not a batch ID: %d ASCII letters and digits", wire.BatchIDLen)
		}
		add(c.name, "batch_id", c.v, err)
	}
	for _, n := range []int{0, 1, 4096, 4097} {
		add("partitions-"+strconv.Itoa(n), "partitions", strconv.Itoa(n), partition.ValidateCount(n))
	}
	return map[string]any{"protocol": protocolVersion, "vectors": out}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\x00") == s }

// ---- jobs.json

type jobInput struct {
	Key         string `json:"key"`
	ID          string `json:"id"`
	IDGenerated bool   `json:"id_generated"`
	Type        string `json:"type"`
	Reply       string `json:"reply"`
	Headers     hdrs   `json:"headers"`
	PayloadHex  string `json:"payload_hex"`
	Call        bool   `json:"call"`
	Retry       bool   `json:"retry"`
}

type jobMessage struct {
	Subject    string `json:"subject"`
	Headers    hdrs   `json:"headers"`
	PayloadHex string `json:"payload_hex"`
}

type parsedJob struct {
	ID          string `json:"id"`
	Key         string `json:"key"`
	Type        string `json:"type"`
	Reply       string `json:"reply"`
	Idempotent  bool   `json:"idempotent"`
	KeepOutcome bool   `json:"keep_outcome"`
	Partition   int    `json:"partition"`
}

type jobVector struct {
	Name        string     `json:"name"`
	Namespace   string     `json:"namespace"`
	Partitions  int        `json:"partitions"`
	Shards      int        `json:"shards"`
	ReplyPrefix string     `json:"reply_prefix"`
	Input       jobInput   `json:"input"`
	Message     jobMessage `json:"message"`
	Parsed      parsedJob  `json:"parsed"`
}

// Generated job and batch IDs in the vectors: nuids, as the client makes.
const (
	conformanceNUID1 = "Gj2Qhk3TYhYAmoxTQJcHq0"
	conformanceNUID2 = "xK9mPq2LrT5vWz8AbC3dE1"
)

// buildJob is the message the client publishes for in: Client.message,
// then what Call adds (keep-outcome) and what a copy published again
// after no stream ack adds (idempotent). A generated ID is replaced by
// in.ID, after checking it was a nuid.
func (g *conformanceGen) buildJob(ns string, in jobInput) *nats.Msg {
	g.t.Helper()
	c := g.clients[ns]
	payload, err := hex.DecodeString(in.PayloadHex)
	if err != nil {
		g.t.Fatal(err)
	}
	r := Request{Key: in.Key, Type: in.Type, Payload: payload}
	if !in.IDGenerated {
		r.ID = in.ID
	}
	if len(in.Headers) > 0 {
		r.Headers = nats.Header{}
		for k, vs := range in.Headers {
			r.Headers[k] = append([]string(nil), vs...)
		}
	}
	m, err := c.e.Message(&r, in.Reply)
	if err != nil {
		g.t.Fatalf("job %+v: %v", in, err)
	}
	if in.IDGenerated {
		if got := m.Header.Get(HeaderJobID); !wire.ValidBatchID(got) {
			g.t.Fatalf("generated job ID %q is not a nuid", got)
		}
		m.Header[HeaderJobID] = []string{in.ID}
	}
	if in.Call {
		m.Header[HeaderKeepOutcome] = oneHeader // as Call does
	}
	if in.Retry {
		m.Header[HeaderIdempotent] = oneHeader // as publish and Call's republish do
	}
	return m
}

func (g *conformanceGen) rules(ns string, p int) wire.Rules {
	topo := g.topos[ns]
	return wire.Rules{Namespace: ns, Partition: p, Partitions: topo.Partitions, ReplyPrefix: topo.Meta.ReplyPrefix,
		Delays: topo.Meta.Delays, DelaysStream: topo.Names.Delays()}
}

func (g *conformanceGen) jobs() any {
	in := []struct {
		name, ns string
		in       jobInput
	}{
		{"submit-generated-id", "keylane", jobInput{Key: "order-1", ID: conformanceNUID1, IDGenerated: true, PayloadHex: hx([]byte("hello"))}},
		{"submit-with-id-type-header", "keylane", jobInput{Key: "customer:42", ID: "order-17", Type: "reserve", Headers: hdrs{"X-Tenant": {"acme"}}, PayloadHex: hx([]byte(`{"sku":"A1","qty":2}`))}},
		{"submit-empty-payload-utf8-key", "keylane", jobInput{Key: "日本語キー", ID: conformanceNUID2, IDGenerated: true}},
		{"submit-multi-value-header-traceparent", "keylane", jobInput{Key: "order-1", ID: "order-18", Headers: hdrs{"X-Tag": {"a", "b"}, "traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}, PayloadHex: "00ff10"}},
		{"submit-retry-copy", "keylane", jobInput{Key: "order-1", ID: conformanceNUID1, IDGenerated: true, PayloadHex: hx([]byte("hello")), Retry: true}},
		{"call-generated-id", "keylane", jobInput{Key: "customer:42", ID: conformanceNUID2, IDGenerated: true, Reply: "_INBOX.Vx3kQ2.-1", Call: true, PayloadHex: hx([]byte("buy"))}},
		{"call-with-id", "keylane", jobInput{Key: "customer:42", ID: "buy-42-1", Type: "buy", Reply: "_INBOX.Vx3kQ2.-2", Call: true, PayloadHex: hx([]byte("buy"))}},
		{"call-retry-copy", "keylane", jobInput{Key: "customer:42", ID: conformanceNUID2, IDGenerated: true, Reply: "_INBOX.Vx3kQ2.-1", Call: true, Retry: true, PayloadHex: hx([]byte("buy"))}},
		{"shards-dashed-namespace", "orders-eu", jobInput{Key: "order-1", ID: "eu-1", PayloadHex: hx([]byte("x"))}},
		{"shards-dashed-namespace-other-shard", "orders-eu", jobInput{Key: keyIn(1, 8, "k"), ID: "eu-2", PayloadHex: hx([]byte("x"))}},
		{"other-reply-prefix", "shop", jobInput{Key: "cart-9", ID: conformanceNUID1, IDGenerated: true, Reply: "replies.client7.-a", Call: true, PayloadHex: hx([]byte("{}"))}},
		{"max-length-key", "shop", jobInput{Key: strings.Repeat("k", partition.MaxKeyLen), ID: "long-key", PayloadHex: ""}},
	}
	var out []jobVector
	for _, v := range in {
		m := g.buildJob(v.ns, v.in)
		topo := g.topos[v.ns]
		p := partition.Of(v.in.Key, topo.Partitions)
		j, err := g.rules(v.ns, p).Parse(m.Subject, m.Header)
		if err != nil {
			g.t.Fatalf("job vector %s refused by the worker's rules: %v", v.name, err)
		}
		if v.in.Headers == nil {
			v.in.Headers = hdrs{}
		}
		out = append(out, jobVector{
			Name: v.name, Namespace: v.ns, Partitions: topo.Partitions, Shards: topo.Shards, ReplyPrefix: topo.Meta.ReplyPrefix,
			Input:   v.in,
			Message: jobMessage{Subject: m.Subject, Headers: hdrs(m.Header), PayloadHex: hx(m.Data)},
			Parsed:  parsedJob{ID: j.ID, Key: j.Key, Type: j.Type, Reply: j.Reply, Idempotent: j.Idempotent, KeepOutcome: j.KeepOutcome, Partition: p},
		})
	}
	return map[string]any{"protocol": protocolVersion, "vectors": out}
}

// ---- batches.json

type batchJobVector struct {
	Key         string `json:"key"`
	ID          string `json:"id"`
	Type        string `json:"type"`
	Reply       string `json:"reply"`
	KeepOutcome bool   `json:"keep_outcome"`
	Idempotent  bool   `json:"idempotent"`
	Headers     hdrs   `json:"headers"`
	PayloadHex  string `json:"payload_hex"`
}

type batchMessageVector struct {
	Subject string `json:"subject"`
	Headers hdrs   `json:"headers"`
	BodyHex string `json:"body_hex"`
}

type batchVector struct {
	Name        string             `json:"name"`
	Namespace   string             `json:"namespace"`
	Partitions  int                `json:"partitions"`
	Shards      int                `json:"shards"`
	ReplyPrefix string             `json:"reply_prefix"`
	Partition   int                `json:"partition"`
	BatchID     string             `json:"batch_id"`
	Jobs        []batchJobVector   `json:"jobs"`
	Message     batchMessageVector `json:"message"`
}

func (g *conformanceGen) batches() any {
	type job struct {
		key, typ, reply string
		headers         hdrs
		payload         []byte
	}
	in := []struct {
		name, ns string
		p        int
		batchID  string
		jobs     []job
	}{
		{"two-submits", "keylane", 1, conformanceNUID1, []job{
			{key: keyIn(1, 4, "order-"), payload: []byte("a")},
			{key: keyIn(1, 4, "order-"), payload: []byte("b")},
		}},
		{"calls-and-submits-mixed", "keylane", 2, conformanceNUID2, []job{
			{key: keyIn(2, 4, "customer:"), reply: "_INBOX.Vx3kQ2.-1", payload: []byte("buy")},
			{key: keyIn(2, 4, "sku-"), typ: "restock", headers: hdrs{"X-Tenant": {"acme"}, "X-Tag": {"a", "b"}}, payload: []byte(`{"qty":5}`)},
			{key: "日本語キー", reply: "_INBOX.Vx3kQ2.-2", payload: nil},
		}},
		{"shard-1-dashed-namespace", "orders-eu", 3, "AAAAAAAAAAAAAAAAAAAAAA", []job{
			{key: keyIn(3, 8, "eu-"), payload: []byte("x")},
			{key: keyIn(3, 8, "eu-"), reply: "_INBOX.z.-9", payload: []byte("y")},
		}},
	}
	var out []batchVector
	for _, v := range in {
		c := g.clients[v.ns]
		topo := g.topos[v.ns]
		ms := make([]*nats.Msg, len(v.jobs))
		var jobs []batchJobVector
		for i, j := range v.jobs {
			ji := jobInput{Key: j.key, ID: "x", IDGenerated: true, Type: j.typ, Reply: j.reply, Headers: j.headers, PayloadHex: hx(j.payload), Call: j.reply != ""}
			m := g.buildJob(v.ns, ji)
			// What sealBatch does, with the vector's batch ID.
			m.Header[headerSealedBatch] = []string{v.batchID}
			m.Header[HeaderJobID] = []string{wire.BatchedJobID(v.batchID, i)}
			ms[i] = m
			h := j.headers
			if h == nil {
				h = hdrs{}
			}
			jobs = append(jobs, batchJobVector{Key: j.key, ID: wire.BatchedJobID(v.batchID, i), Type: j.typ, Reply: j.reply, KeepOutcome: j.reply != "", Headers: h, PayloadHex: hx(j.payload)})
		}
		m, err := c.e.BatchMessage(v.p, ms)
		if err != nil {
			g.t.Fatal(err)
		}
		// The body is wire.EncodeBatch of the jobs as the vector lists them.
		wjobs := make([]wire.BatchJob, len(jobs))
		for i, j := range jobs {
			p, _ := hex.DecodeString(j.PayloadHex)
			wjobs[i] = wire.BatchJob{Key: j.Key, ID: j.ID, Type: j.Type, Reply: j.Reply, KeepOutcome: j.KeepOutcome, Idempotent: j.Idempotent, Payload: p}
			if len(j.Headers) > 0 {
				wjobs[i].Header = j.Headers
			}
		}
		body, err := wire.EncodeBatch(wjobs)
		if err != nil {
			g.t.Fatal(err)
		}
		if !bytes.Equal(body, m.Data) {
			g.t.Fatalf("batch %s: the client's body %x is not EncodeBatch's %x", v.name, m.Data, body)
		}
		es, err := g.rules(v.ns, v.p).ParseBatch(m.Subject, m.Header, m.Data)
		if err != nil {
			g.t.Fatalf("batch %s refused: %v", v.name, err)
		}
		for i, e := range es {
			if e.Err != nil {
				g.t.Fatalf("batch %s job %d refused: %v", v.name, i, e.Err)
			}
		}
		out = append(out, batchVector{Name: v.name, Namespace: v.ns, Partitions: topo.Partitions, Shards: topo.Shards, ReplyPrefix: topo.Meta.ReplyPrefix,
			Partition: v.p, BatchID: v.batchID, Jobs: jobs, Message: batchMessageVector{Subject: m.Subject, Headers: hdrs(m.Header), BodyHex: hx(m.Data)}})
	}
	return map[string]any{"protocol": protocolVersion, "vectors": out}
}

// ---- outcomes.json

type keptVector struct {
	Name      string `json:"name"`
	ValueHex  string `json:"value_hex"`
	Kind      string `json:"kind"`
	ResultHex string `json:"result_hex"`
	Error     string `json:"error"`
}

type batchOutcomeVector struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	ValueHex string `json:"value_hex"`
}

type batchEntryVector struct {
	Name     string               `json:"name"`
	Key      string               `json:"key"`
	BatchID  string               `json:"batch_id"`
	Outcomes []batchOutcomeVector `json:"outcomes"`
	EntryHex string               `json:"entry_hex"`
}

type badEntryVector struct {
	Name     string `json:"name"`
	EntryHex string `json:"entry_hex"`
	Error    string `json:"error"`
}

type lookupVector struct {
	Name     string `json:"name"`
	EntryHex string `json:"entry_hex"`
	BatchID  string `json:"batch_id"`
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Found    bool   `json:"found"`
	ValueHex string `json:"value_hex"`
	Error    string `json:"error"`
}

// outcomeKind names a decoded outcome's kind as the vectors do.
func outcomeKind(err error) (kind, text string) {
	var re *RemoteError
	switch {
	case err == nil:
		return "ok", ""
	case !errors.As(err, &re):
		return "?", err.Error()
	case re.DeadLettered:
		return "dead", re.Message
	case re.Permanent:
		return "permanent", re.Message
	}
	return "error", re.Message
}

func (g *conformanceGen) outcomes() any {
	kept := []struct {
		name string
		res  []byte
		err  error
		dead bool
	}{
		{"ok-json", []byte(`{"stock":8}`), nil, false},
		{"ok-empty-result", nil, nil, false},
		{"ok-binary", []byte{0, 0xff, 'o'}, nil, false},
		{"error", nil, errors.New("out of stock"), false},
		{"permanent", nil, Permanent(errors.New("no such item")), false},
		{"dead-after-max-deliver", nil, errors.New("database down"), true},
		{"dead-malformed", nil, Permanent(errors.New("malformed: bad Keylane-Type header: wire: job type must be at most 256 bytes of UTF-8 without control characters or white space at either end (got \" x\")")), true},
	}
	var ks []keptVector
	values := map[string][]byte{}
	for _, k := range kept {
		v := encodeResult(k.res, k.err, k.dead)
		res, err, ok := decodeResult(v)
		if !ok {
			g.t.Fatalf("kept %s does not decode", k.name)
		}
		kind, text := outcomeKind(err)
		ks = append(ks, keptVector{Name: k.name, ValueHex: hx(v), Kind: kind, ResultHex: hx(res), Error: text})
		values[k.name] = v
	}
	entries := []struct {
		name    string
		batchID string
		outs    []wire.BatchOutcome
	}{
		{"two-outcomes", conformanceNUID1, []wire.BatchOutcome{
			{Index: 0, ID: wire.BatchedJobID(conformanceNUID1, 0), Value: values["ok-json"]},
			{Index: 1, ID: wire.BatchedJobID(conformanceNUID1, 1), Value: values["dead-after-max-deliver"]},
		}},
		{"gaps-and-last-index", conformanceNUID2, []wire.BatchOutcome{
			{Index: 2, ID: wire.BatchedJobID(conformanceNUID2, 2), Value: values["ok-empty-result"]},
			{Index: wire.MaxBatchJobs - 1, ID: wire.BatchedJobID(conformanceNUID2, wire.MaxBatchJobs-1), Value: values["permanent"]},
		}},
	}
	var es []batchEntryVector
	var entry1 []byte
	for _, e := range entries {
		b, err := wire.EncodeBatchOutcomes(e.batchID, e.outs)
		if err != nil {
			g.t.Fatal(err)
		}
		if entry1 == nil {
			entry1 = b
		}
		id, outs, err := wire.DecodeBatchOutcomes(b)
		if err != nil || id != e.batchID || len(outs) != len(e.outs) {
			g.t.Fatalf("entry %s does not decode: %v", e.name, err)
		}
		v := batchEntryVector{Name: e.name, Key: wire.BatchOutcomesKey(e.batchID), BatchID: e.batchID, EntryHex: hx(b)}
		for _, o := range e.outs {
			v.Outcomes = append(v.Outcomes, batchOutcomeVector{o.Index, o.ID, hx(o.Value)})
		}
		es = append(es, v)
	}
	// Entries a reader refuses, made from entry1 by hand.
	id1 := conformanceNUID1
	head := func(version byte, batchID string) []byte {
		b := append([]byte("KLO"), version)
		b = binary.AppendUvarint(b, uint64(len(batchID)))
		return append(b, batchID...)
	}
	outcome := func(b []byte, index int, id string, v []byte) []byte {
		b = binary.AppendUvarint(b, uint64(index))
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		return append(b, v...)
	}
	ok := values["ok-json"]
	one := func(version byte, batchID string, index int, id string, v []byte) []byte {
		return outcome(append(head(version, batchID), 1), index, id, v)
	}
	bad := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"wrong-magic", append([]byte("KLB"), entry1[3:]...)},
		{"wrong-version", one(2, id1, 0, id1+".0", ok)},
		{"batch-id-not-a-nuid", one(1, "order-1", 0, "order-1.0", ok)},
		{"no-outcome", append(head(1, id1), 0)},
		{"job-id-not-batch-and-index", one(1, id1, 0, id1+".1", ok)},
		{"job-id-of-another-batch", one(1, id1, 0, conformanceNUID2+".0", ok)},
		{"empty-outcome", one(1, id1, 0, id1+".0", nil)},
		{"index-over-max", one(1, id1, wire.MaxBatchJobs, id1+"."+strconv.Itoa(wire.MaxBatchJobs), ok)},
		{"indexes-not-ascending", outcome(outcome(append(head(1, id1), 2), 1, id1+".1", ok), 0, id1+".0", ok)},
		{"index-repeated", outcome(outcome(append(head(1, id1), 2), 0, id1+".0", ok), 0, id1+".0", ok)},
		{"bytes-after-last", append(one(1, id1, 0, id1+".0", ok), 0)},
		{"length-past-end", one(1, id1, 0, id1+".0", ok)[:len(one(1, id1, 0, id1+".0", ok))-1]},
		{"count-not-shortest-uvarint", outcome(append(head(1, id1), 0x81, 0x00), 0, id1+".0", ok)},
	}
	var bs []badEntryVector
	for _, b := range bad {
		_, _, err := wire.DecodeBatchOutcomes(b.b)
		if err == nil {
			g.t.Fatalf("bad entry %s decodes", b.name)
		}
		bs = append(bs, badEntryVector{Name: b.name, EntryHex: hx(b.b), Error: err.Error()})
	}
	lookups := []struct {
		name    string
		entry   []byte
		batchID string
		index   int
		id      string
	}{
		{"found", entry1, id1, 1, wire.BatchedJobID(id1, 1)},
		{"no-outcome-at-index", entry1, id1, 5, wire.BatchedJobID(id1, 5)},
		{"entry-of-another-batch", entry1, conformanceNUID2, 0, wire.BatchedJobID(conformanceNUID2, 0)},
		{"another-job-at-the-index", entry1, id1, 0, "order-1"},
	}
	var ls []lookupVector
	for _, l := range lookups {
		v, err := wire.FindBatchOutcome(l.entry, l.batchID, l.index, l.id)
		lv := lookupVector{Name: l.name, EntryHex: hx(l.entry), BatchID: l.batchID, Index: l.index, ID: l.id, Found: err == nil, ValueHex: hx(v)}
		if err != nil {
			lv.Error = err.Error()
		}
		ls = append(ls, lv)
	}
	// Job IDs a reader looks for in a batch's entry, and those it does
	// not (wire.ParseBatchedJobID).
	var ids []batchedIDVector
	for _, id := range []string{
		id1 + ".0", id1 + ".1023", id1 + ".17",
		id1 + ".1024", id1 + ".01", id1 + ".-1", id1 + ".", id1 + ".1x", id1 + ".+1",
		id1[:21] + ".0", id1 + "A.0", "order-1.0", "order-1", "." + id1, id1[:21] + "-.0", id1 + ".0.0",
	} {
		v := batchedIDVector{ID: id}
		v.BatchID, v.Index, v.OK = wire.ParseBatchedJobID(id)
		ids = append(ids, v)
	}
	return map[string]any{"protocol": protocolVersion, "kept": ks, "batch_entries": es, "bad_batch_entries": bs, "lookups": ls, "batched_ids": ids}
}

// batchedIDVector is a job ID and how wire.ParseBatchedJobID reads it.
type batchedIDVector struct {
	ID      string `json:"id"`
	OK      bool   `json:"ok"`
	BatchID string `json:"batch_id"`
	Index   int    `json:"index"`
}

// ---- replies.json

type decodedReply struct {
	OK           bool   `json:"ok"`
	ResultHex    string `json:"result_hex"`
	Error        string `json:"error"`
	Kind         string `json:"kind"`
	Permanent    bool   `json:"permanent"`
	DeadLettered bool   `json:"dead_lettered"`
}

type singleReplyVector struct {
	Name    string       `json:"name"`
	Headers hdrs         `json:"headers"`
	DataHex string       `json:"data_hex"`
	Decoded decodedReply `json:"decoded"`
}

type groupedEntryVector struct {
	Token     string `json:"token"`
	Kind      string `json:"kind"`
	ResultHex string `json:"result_hex"`
	Error     string `json:"error"`
}

type groupedVector struct {
	Name    string               `json:"name"`
	BodyHex string               `json:"body_hex"`
	Valid   bool                 `json:"valid"`
	Entries []groupedEntryVector `json:"entries"`
}

type heldVector struct {
	Name    string `json:"name"`
	Reply   string `json:"reply"`
	Subject string `json:"subject"`
	Headers hdrs   `json:"headers"`
}

type streamAckVector struct {
	Name      string `json:"name"`
	DataHex   string `json:"data_hex"`
	Stored    bool   `json:"stored"`
	Duplicate bool   `json:"duplicate"`
	ErrorCode int    `json:"error_code"`
	// Class is what the Go client makes of the ack (ackClass).
	Class string `json:"class"`
}

// ackClass is what the Go client makes of a stream ack: "stored",
// "duplicate", "key_backlog_full" (the key at its cap: never retried;
// internal/client/admission.go's refused), "transient" (published again, the same
// message: publish, retryablePublish), "limit" (a full stream: reported)
// or "permanent" (reported) — decided by err_code first (natserr.Classify).
func ackClass(data []byte) string {
	dup, err := pubAckError(&nats.Msg{Data: data})
	switch {
	case err == nil && dup:
		return "duplicate"
	case err == nil:
		return "stored"
	case backlogFull(err):
		return "key_backlog_full"
	case retryablePublish(err):
		return "transient"
	case natserr.Classify(err) == natserr.Limit:
		return "limit"
	}
	return "permanent"
}

// serverRefusal is a real server's ack of the publish that goes over a
// stream's limit: a key's cap (perSubject) or the stream's message count.
func serverRefusal(t *testing.T, js jetstream.JetStream, perSubject bool) *jetstream.APIError {
	name := "ACKCHECK"
	sc := jetstream.StreamConfig{Name: name, Subjects: []string{"ackcheck.>"}, Storage: jetstream.MemoryStorage, Discard: jetstream.DiscardNew, MaxMsgs: 1}
	if perSubject {
		sc.MaxMsgs, sc.MaxMsgsPerSubject, sc.DiscardNewPerSubject = -1, 1, true
	}
	if _, err := js.CreateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(ctx(t), name) }()
	var apiErr *jetstream.APIError
	for i := range 2 {
		_, err := js.Publish(ctx(t), "ackcheck.k", nil)
		if i == 0 && err != nil {
			t.Fatal(err)
		}
		if i == 1 && !errors.As(err, &apiErr) {
			t.Fatalf("the server took a message over the limit: %v", err)
		}
	}
	return apiErr
}

func decodeReplyVector(m *nats.Msg) decodedReply {
	res, err := decodeReply(m)
	kind, text := outcomeKind(err)
	d := decodedReply{OK: err == nil, ResultHex: hx(res), Error: text}
	if err != nil {
		d.Kind = kind
		var re *RemoteError
		errors.As(err, &re)
		d.Permanent, d.DeadLettered = re.Permanent, re.DeadLettered
	}
	return d
}

func (g *conformanceGen) replies() any {
	const subject = "_INBOX.Vx3kQ2.-1"
	var singles []singleReplyVector
	for _, r := range []struct {
		name string
		m    *nats.Msg
	}{
		{"ok", replyMsg(subject, []byte(`{"stock":8}`), nil, false)},
		{"ok-empty-result", replyMsg(subject, nil, nil, false)},
		{"error", replyMsg(subject, nil, errors.New("out of stock"), false)},
		{"error-without-text", replyMsg(subject, nil, errors.New(""), false)},
		{"permanent", replyMsg(subject, nil, Permanent(errors.New("no such item")), false)},
		{"dead-after-max-deliver", replyMsg(subject, nil, errors.New("database down"), true)},
		{"dead-malformed", replyMsg(subject, nil, Permanent(errors.New(`malformed: bad Nats-Msg-Id header: wire: job ID must be 1-256 characters of A-Z a-z 0-9 _ - = and single dots between them (got "order..1")`)), true)},
		// Read, never sent by a worker of this release: any error header
		// makes a reply an error.
		{"read-empty-error-header", &nats.Msg{Subject: subject, Header: nats.Header{HeaderError: {""}}, Data: []byte("ignored")}},
		{"read-kind-without-error", &nats.Msg{Subject: subject, Header: nats.Header{HeaderErrorKind: {"permanent"}}}},
		{"read-unknown-kind", &nats.Msg{Subject: subject, Header: nats.Header{HeaderError: {"x"}, HeaderErrorKind: {"later-kind"}}}},
	} {
		h := hdrs(r.m.Header)
		if h == nil {
			h = hdrs{}
		}
		singles = append(singles, singleReplyVector{Name: r.name, Headers: h, DataHex: hx(r.m.Data), Decoded: decodeReplyVector(r.m)})
	}
	entry := func(b []byte, token string, kind byte, rest string) []byte {
		return appendGroupedEntry(b, token, kind, []byte(rest))
	}
	g0 := []byte{groupedVersion}
	var grouped []groupedVector
	for _, r := range []struct {
		name string
		b    []byte
	}{
		{"two-results", entry(entry(g0, "-1", resultOK, `{"stock":8}`), "-2", resultOK, `{"stock":7}`)},
		{"every-kind", entry(entry(entry(entry(g0, "-a", resultOK, ""), "-b", resultErr, "out of stock"), "-c", resultPerm, "no such item"), "-zz9", resultDead, "database down")},
		{"bad-version", entry(entry([]byte{'H'}, "-1", resultOK, "x"), "-2", resultOK, "y")},
		{"bad-no-entry", g0},
		{"bad-token-without-mark", entry(g0, "1", resultOK, "x")},
		{"bad-token-uppercase", entry(g0, "-A", resultOK, "x")},
		{"bad-token-only-mark", entry(g0, "-", resultOK, "x")},
		{"bad-token-repeated", entry(entry(g0, "-1", resultOK, "x"), "-1", resultOK, "y")},
		{"bad-unknown-kind", entry(g0, "-1", 'x', "x")},
		{"bad-empty-outcome", binary.AppendUvarint(append(g0, 2, '-', '1'), 0)},
		{"bad-length-past-end", entry(g0, "-1", resultOK, "xyz")[:7]},
		{"bad-bytes-after-last", append(entry(g0, "-1", resultOK, "x"), 5)},
	} {
		v := groupedVector{Name: r.name, BodyHex: hx(r.b)}
		outs, err := DecodeGroupedReply(r.b)
		v.Valid = err == nil
		for _, o := range outs {
			kind, text := outcomeKind(o.Err)
			v.Entries = append(v.Entries, groupedEntryVector{Token: o.Token, Kind: kind, ResultHex: hx(o.Result), Error: text})
		}
		if v.Entries == nil {
			v.Entries = []groupedEntryVector{}
		}
		grouped = append(grouped, v)
	}
	var held []heldVector
	for _, r := range []struct{ name, reply string }{{"held-for-epoch", subject}} {
		m := heldMsg(r.reply, ErrEpoch)
		held = append(held, heldVector{Name: r.name, Reply: r.reply, Subject: m.Subject, Headers: hdrs(m.Header)})
	}
	var acks []streamAckVector
	keyFull := `{"error":{"code":503,"err_code":10077,"description":"maximum messages per subject exceeded"}}`
	streamFull := `{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`
	// Those two as a real server sends them: the same code and err_code,
	// told apart by the description only.
	for _, c := range []struct {
		data       string
		perSubject bool
	}{{keyFull, true}, {streamFull, false}} {
		got := serverRefusal(g.t, g.js, c.perSubject)
		var want struct{ Error *jetstream.APIError }
		if err := json.Unmarshal([]byte(c.data), &want); err != nil {
			g.t.Fatal(err)
		}
		if got.Code != want.Error.Code || got.ErrorCode != want.Error.ErrorCode || got.Description != want.Error.Description {
			g.t.Fatalf("the server refuses with %+v, the vector says %s", got, c.data)
		}
	}
	for _, a := range []struct{ name, data string }{
		{"stored", `{"stream":"KEYLANE_JOBS","seq":12}`},
		{"stored-in-domain", `{"stream":"KEYLANE_JOBS","domain":"hub","seq":13}`},
		{"duplicate", `{"stream":"KEYLANE_JOBS","seq":12,"duplicate":true}`},
		{"key-backlog-full", keyFull},
		{"stream-full-messages", streamFull},
		{"stream-full-bytes", `{"error":{"code":503,"err_code":10077,"description":"maximum bytes exceeded"}}`},
		{"insufficient-resources", `{"error":{"code":503,"err_code":10023,"description":"insufficient resources"}}`},
		{"cluster-not-available", `{"error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}`},
		{"no-suitable-peers", `{"error":{"code":400,"err_code":10005,"description":"no suitable peers for placement"}}`},
		{"wrong-stream", `{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}`},
		{"message-too-large", `{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}`},
		{"stream-not-found", `{"error":{"code":404,"err_code":10059,"description":"stream not found"}}`},
		{"schedules-disabled", `{"error":{"code":400,"err_code":10188,"description":"message schedules is disabled"}}`},
		// Read, with an err_code this release does not list: the code decides.
		{"read-unlisted-503", `{"error":{"code":503,"err_code":19999,"description":"a later release's"}}`},
		{"read-unlisted-408", `{"error":{"code":408,"err_code":19998,"description":"a later release's"}}`},
		{"read-unlisted-500", `{"error":{"code":500,"err_code":19997,"description":"a later release's"}}`},
		{"read-unlisted-400", `{"error":{"code":400,"err_code":19996,"description":"a later release's"}}`},
	} {
		dup, err := pubAckError(&nats.Msg{Data: []byte(a.data)})
		v := streamAckVector{Name: a.name, DataHex: hx([]byte(a.data)), Stored: err == nil, Duplicate: dup, Class: ackClass([]byte(a.data))}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) {
			v.ErrorCode = int(apiErr.ErrorCode)
		}
		acks = append(acks, v)
	}
	return map[string]any{"protocol": protocolVersion, "single": singles, "grouped": grouped, "held": held, "stream_acks": acks}
}

// ---- refusals.json

type refusalRules struct {
	Namespace    string `json:"namespace"`
	Partition    int    `json:"partition"`
	Partitions   int    `json:"partitions"`
	ReplyPrefix  string `json:"reply_prefix"`
	Delays       bool   `json:"delays"`
	DelaysStream string `json:"delays_stream"`
	StoredAt     string `json:"stored_at,omitempty"`
}

type refusalEntry struct {
	Index       int    `json:"index"`
	Error       string `json:"error"`
	ErrorPrefix string `json:"error_prefix"`
	Reply       string `json:"reply"`
}

type refusalVector struct {
	Name        string         `json:"name"`
	MessageKind string         `json:"message_kind"`
	Rules       refusalRules   `json:"rules"`
	Subject     string         `json:"subject"`
	Headers     hdrs           `json:"headers"`
	HeadersHex  hdrs           `json:"headers_hex"`
	BodyHex     string         `json:"body_hex"`
	Refusals    []refusalEntry `json:"refusals"`
	Accepted    []int          `json:"accepted,omitempty"`
}

// hexHeaders is h with every value in hex: JSON strings cannot carry a
// value that is not UTF-8.
func hexHeaders(h hdrs) hdrs {
	out := hdrs{}
	for k, vs := range h {
		for _, v := range vs {
			out[k] = append(out[k], hx([]byte(v)))
		}
	}
	return out
}

func unhexHeaders(t *testing.T, h hdrs) hdrs {
	out := hdrs{}
	for k, vs := range h {
		for _, v := range vs {
			b, err := hex.DecodeString(v)
			if err != nil {
				t.Fatal(err)
			}
			out[k] = append(out[k], string(b))
		}
	}
	return out
}

// errorPrefix is the stable beginning of a refusal's text: up to its
// first quoted value.
func errorPrefix(s string) string {
	if i := strings.IndexByte(s, '"'); i >= 0 {
		return s[:i]
	}
	return s
}

func newRefusal(index int, why error, reply string) refusalEntry {
	text := "malformed: " + why.Error() // the worker's (internal/tenure, fetch.go, malformedAt)
	return refusalEntry{Index: index, Error: text, ErrorPrefix: errorPrefix(text), Reply: reply}
}

func (g *conformanceGen) refusals() any {
	const ns, n, p = "keylane", 4, 1
	rules := wire.Rules{Namespace: ns, Partition: p, Partitions: n, ReplyPrefix: DefaultReplyPrefix, DelaysStream: Names{Namespace: ns}.Delays()}
	delayRules := rules
	delayRules.Delays = true
	rr := func(r wire.Rules) refusalRules {
		return refusalRules{Namespace: r.Namespace, Partition: r.Partition, Partitions: r.Partitions, ReplyPrefix: r.ReplyPrefix, Delays: r.Delays, DelaysStream: r.DelaysStream}
	}
	key := keyIn(p, n, "order-")
	other := keyIn(2, n, "order-")
	const reply = "_INBOX.Vx3kQ2.-1"
	subject := partition.Subject(ns, p, key)
	base := func() hdrs {
		return hdrs{HeaderJobID: {"order-17"}, HeaderKey: {key}, HeaderPartitions: {"4"}, HeaderReply: {reply}}
	}
	with := func(set hdrs, del ...string) hdrs {
		h := base()
		for _, d := range del {
			delete(h, d)
		}
		for k, v := range set {
			h[k] = v
		}
		return h
	}
	var out []refusalVector
	job := func(name string, r wire.Rules, subject string, h hdrs) {
		j, err := r.Parse(subject, h)
		if err == nil {
			g.t.Fatalf("refusal %s accepted", name)
		}
		out = append(out, refusalVector{Name: name, MessageKind: "job", Rules: rr(r), Subject: subject, Headers: h, BodyHex: hx([]byte("x")), Refusals: []refusalEntry{newRefusal(-1, err, j.Reply)}})
	}
	job("server-header-rollup", rules, subject, with(hdrs{"Nats-Rollup": {"sub"}}))
	job("server-header-schedule", rules, subject, with(hdrs{"Nats-Schedule": {"@at 2030-01-01T00:00:00Z"}}))
	job("no-key", rules, subject, with(nil, HeaderKey))
	job("empty-key", rules, subject, with(hdrs{HeaderKey: {""}}))
	job("key-twice", rules, subject, with(hdrs{HeaderKey: {key, key}}))
	job("key-too-long", rules, partition.Subject(ns, p, strings.Repeat("k", 1025)), with(hdrs{HeaderKey: {strings.Repeat("k", 1025)}}))
	job("key-control-character", rules, subject, with(hdrs{HeaderKey: {"order\x01"}}))
	job("key-not-utf8", rules, subject, with(hdrs{HeaderKey: {"order-\xff"}}))
	job("key-trailing-space", rules, partition.Subject(ns, p, key+" "), with(hdrs{HeaderKey: {key + " "}}))
	job("subject-of-another-key", rules, partition.Subject(ns, p, other), base())
	job("subject-without-key-token", rules, ns+".jobs.1.batch", base())
	job("key-of-another-partition", rules, partition.Subject(ns, p, other), with(hdrs{HeaderKey: {other}}))
	job("routed-with-another-partition-count", rules, subject, with(hdrs{HeaderPartitions: {"8"}}))
	job("partition-count-twice", rules, subject, with(hdrs{HeaderPartitions: {"4", "4"}}))
	job("reply-outside-prefix", rules, subject, with(hdrs{HeaderReply: {"$JS.API.STREAM.DELETE.KEYLANE_JOBS"}}))
	job("reply-wildcard", rules, subject, with(hdrs{HeaderReply: {"_INBOX.>"}}))
	job("reply-twice", rules, subject, with(hdrs{HeaderReply: {reply, reply}}))
	job("job-id-double-dot", rules, subject, with(hdrs{HeaderJobID: {"order..1"}}))
	job("job-id-too-long", rules, subject, with(hdrs{HeaderJobID: {strings.Repeat("x", 257)}}))
	job("job-id-twice", rules, subject, with(hdrs{HeaderJobID: {"a", "b"}}))
	job("type-leading-space", rules, subject, with(hdrs{HeaderType: {" reserve"}}))
	job("type-too-long", rules, subject, with(hdrs{HeaderType: {strings.Repeat("t", 257)}}))
	job("type-twice", rules, subject, with(hdrs{HeaderType: {"a", "b"}}))
	job("delayed-id-without-delays", rules, subject, with(hdrs{HeaderDelayedID: {"victim-1"}}, HeaderJobID))
	job("delayed-id-twice", rules, subject, with(hdrs{HeaderDelayedID: {"victim-1", "victim-2"}}, HeaderJobID))
	job("delayed-id-not-from-its-schedule", delayRules, subject, with(hdrs{HeaderDelayedID: {"victim-1"}}, HeaderJobID))
	job("delayed-id-not-sourced-from-delays", delayRules, subject, with(hdrs{HeaderDelayedID: {"victim-1"}, "Nats-Scheduler": {partition.ScheduleSubject(ns, p, "victim-1")}}, HeaderJobID))
	job("run-at-on-a-key-subject", rules, subject, with(hdrs{wire.HeaderRunAt: {"2030-01-01T00:00:00Z"}}))

	// Delayed jobs' submissions (on the partition's delay subject).
	stored := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	delayed := func(name string, r wire.Rules, subject string, h hdrs) {
		d, err := r.ParseDelayed(subject, h, stored)
		if err == nil {
			g.t.Fatalf("refusal %s accepted", name)
		}
		v := refusalVector{Name: name, MessageKind: "delayed", Rules: rr(r), Subject: subject, Headers: h, BodyHex: hx([]byte("x")), Refusals: []refusalEntry{newRefusal(-1, err, d.Reply)}}
		v.Rules.StoredAt = stored.Format(time.RFC3339Nano)
		out = append(out, v)
	}
	dsubj := partition.DelaySubject(ns, p, "order-17")
	runAt := hdrs{wire.HeaderRunAt: {"2026-11-27T12:00:00Z"}}
	dbase := func(set hdrs, del ...string) hdrs {
		h := with(runAt, HeaderReply)
		for _, d := range del {
			delete(h, d)
		}
		for k, v := range set {
			h[k] = v
		}
		return h
	}
	delayed("delayed-no-run-at", delayRules, dsubj, dbase(nil, wire.HeaderRunAt))
	delayed("delayed-run-at-not-rfc3339", delayRules, dsubj, dbase(hdrs{wire.HeaderRunAt: {"tomorrow"}}))
	delayed("delayed-run-at-past-30-days", delayRules, dsubj, dbase(hdrs{wire.HeaderRunAt: {"2027-01-01T00:00:00Z"}}))
	delayed("delayed-with-reply", delayRules, dsubj, dbase(hdrs{HeaderReply: {reply}}))
	delayed("delayed-without-id", delayRules, dsubj, dbase(nil, HeaderJobID))
	delayed("delayed-on-another-ids-subject", delayRules, partition.DelaySubject(ns, p, "order-18"), dbase(nil))
	delayed("delayed-with-keylane-job-id", delayRules, dsubj, dbase(hdrs{HeaderDelayedID: {"order-17"}}))

	// Batches: refused whole, or job by job.
	batchID := conformanceNUID1
	bsubj := wire.BatchSubject(ns, p)
	goodJobs := func() []wire.BatchJob {
		return []wire.BatchJob{
			{Key: key, ID: wire.BatchedJobID(batchID, 0), Reply: reply, KeepOutcome: true, Payload: []byte("a")},
			{Key: keyIn(p, n, "sku-"), ID: wire.BatchedJobID(batchID, 1), Payload: []byte("b")},
		}
	}
	encode := func(jobs []wire.BatchJob) []byte {
		b, err := wire.EncodeBatch(jobs)
		if err != nil {
			g.t.Fatal(err)
		}
		return b
	}
	goodBody := encode(goodJobs())
	bhdrs := func(set hdrs, del ...string) hdrs {
		h := hdrs{HeaderJobID: {batchID}, wire.HeaderBatch: {"1"}, wire.HeaderBatchJobs: {"2"}, HeaderPartitions: {"4"}}
		for _, d := range del {
			delete(h, d)
		}
		for k, v := range set {
			h[k] = v
		}
		return h
	}
	batch := func(name, subject string, h hdrs, body []byte) {
		es, err := rules.ParseBatch(subject, h, body)
		v := refusalVector{Name: name, MessageKind: "batch", Rules: rr(rules), Subject: subject, Headers: h, BodyHex: hx(body)}
		if err != nil {
			v.Refusals = []refusalEntry{newRefusal(-1, err, "")}
		}
		for i, e := range es {
			if e.Err != nil {
				v.Refusals = append(v.Refusals, newRefusal(i, e.Err, e.Job.Reply))
			} else {
				v.Accepted = append(v.Accepted, i)
			}
		}
		if len(v.Refusals) == 0 {
			g.t.Fatalf("refusal %s accepted", name)
		}
		out = append(out, v)
	}
	batch("batch-server-header-rollup", bsubj, bhdrs(hdrs{"Nats-Rollup": {"sub"}}), goodBody)
	batch("batch-header-twice", bsubj, bhdrs(hdrs{wire.HeaderBatch: {"1", "1"}}), goodBody)
	batch("batch-on-another-partitions-subject", wire.BatchSubject(ns, 2), bhdrs(nil), goodBody)
	batch("batch-on-a-key-subject", subject, bhdrs(nil), goodBody)
	batch("batch-version-2", bsubj, bhdrs(hdrs{wire.HeaderBatch: {"2"}}), goodBody)
	batch("batch-with-key-header", bsubj, bhdrs(hdrs{HeaderKey: {key}}), goodBody)
	batch("batch-with-reply-header", bsubj, bhdrs(hdrs{HeaderReply: {reply}}), goodBody)
	batch("batch-without-partition-count", bsubj, bhdrs(nil, HeaderPartitions), goodBody)
	batch("batch-another-partition-count", bsubj, bhdrs(hdrs{HeaderPartitions: {"8"}}), goodBody)
	batch("batch-without-id", bsubj, bhdrs(nil, HeaderJobID), goodBody)
	batch("batch-id-not-a-nuid", bsubj, bhdrs(hdrs{HeaderJobID: {"order-17"}}), goodBody)
	batch("batch-jobs-missing", bsubj, bhdrs(nil, wire.HeaderBatchJobs), goodBody)
	batch("batch-jobs-wrong", bsubj, bhdrs(hdrs{wire.HeaderBatchJobs: {"3"}}), goodBody)
	batch("body-empty", bsubj, bhdrs(nil), nil)
	batch("body-wrong-magic", bsubj, bhdrs(nil), append([]byte("KLX"), goodBody[3:]...))
	batch("body-wrong-version", bsubj, bhdrs(nil), append([]byte("KLB\x02"), goodBody[4:]...))
	batch("body-no-jobs", bsubj, bhdrs(hdrs{wire.HeaderBatchJobs: {"0"}}), []byte("KLB\x01\x00"))
	batch("body-count-over-max", bsubj, bhdrs(hdrs{wire.HeaderBatchJobs: {"1025"}}), append(binary.AppendUvarint([]byte("KLB\x01"), 1025), make([]byte, 7*1025)...))
	batch("body-count-not-shortest-uvarint", bsubj, bhdrs(nil), append([]byte("KLB\x01\x82\x00"), goodBody[5:]...))
	batch("body-truncated", bsubj, bhdrs(nil), goodBody[:len(goodBody)-1])
	batch("body-bytes-after-last-job", bsubj, bhdrs(nil), append(slices.Clone(goodBody), 0))
	{
		// One job: key "k", ID, empty type and reply, then flags.
		j := wire.BatchJob{Key: key, ID: wire.BatchedJobID(batchID, 0), Payload: []byte("a")}
		body := encode([]wire.BatchJob{j})
		flagsAt := 5 + 1 + len(j.Key) + 1 + len(j.ID) + 1 + 1
		b := slices.Clone(body)
		b[flagsAt] = 4
		batch("body-unknown-flag", bsubj, bhdrs(hdrs{wire.HeaderBatchJobs: {"1"}}), b)
		// Headers "b" then "a": not ascending.
		b = slices.Clone(body[:flagsAt+1])
		b = append(b, 2, 1, 'b', 1, 1, 'x', 1, 'a', 1, 1, 'y')
		b = append(b, 1, 'a')
		batch("body-header-names-not-ascending", bsubj, bhdrs(hdrs{wire.HeaderBatchJobs: {"1"}}), b)
	}
	job2 := func(mod func(j *wire.BatchJob)) []byte {
		jobs := goodJobs()
		mod(&jobs[1])
		return encode(jobs)
	}
	batch("batch-job-key-of-another-partition", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Key = other }))
	batch("batch-job-key-control-character", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Key = "sku\n1" }))
	batch("batch-job-key-empty", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Key = "" }))
	batch("batch-job-reply-outside-prefix", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Reply = "$JS.API.STREAM.DELETE.KEYLANE_JOBS" }))
	batch("batch-job-id-empty", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.ID = "" }))
	batch("batch-job-id-not-its-batchs", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.ID = "victim-1" }))
	batch("batch-job-id-another-index", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.ID = wire.BatchedJobID(batchID, 5) }))
	batch("batch-job-id-twice", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.ID = wire.BatchedJobID(batchID, 0) }))
	batch("batch-job-id-unstorable", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.ID = "a..b" }))
	batch("batch-job-type-control-character", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Type = "re\tstock" }))
	batch("batch-job-reserved-header", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Header = map[string][]string{"Nats-Rollup": {"sub"}} }))
	batch("batch-job-bad-header-value", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.Header = map[string][]string{"X-Tenant": {" acme"}} }))
	batch("batch-job-callers-id-unstorable", bsubj, bhdrs(nil), job2(func(j *wire.BatchJob) { j.ID, j.Idempotent = "order..7", true }))
	{
		jobs := goodJobs()
		jobs[0].Type = " reserve"
		batch("batch-job-refused-tells-its-caller", bsubj, bhdrs(nil), encode(jobs))
	}
	for i := range out {
		out[i].HeadersHex = hexHeaders(out[i].Headers)
	}
	return map[string]any{"protocol": protocolVersion, "error_kind": "dead", "vectors": out}
}

// TestConformanceVectorsRead reads the files as another client would (by
// their JSON fields, bytes from hex) and checks each against the code in
// the reading direction: the key's hash, token and partitions, the worker's
// reading of each job, batch and refused message, and the decoding of each
// kept outcome and reply.
func TestConformanceVectorsRead(t *testing.T) {
	read := func(name string, v any) {
		b, err := os.ReadFile(filepath.Join(conformanceDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var keys struct{ Vectors []keyVector }
	read("keys.json", &keys)
	for _, v := range keys.Vectors {
		key := string(unhex(v.KeyHex))
		if partition.KeyToken(key) != v.Token || fmt.Sprintf("%016x", xxhash.Sum64String(key)) != v.XXHash64Hex {
			t.Errorf("keys.json %s: token %s, the code's %s", v.Name, v.Token, partition.KeyToken(key))
		}
		for _, p := range v.Partitions {
			if got := partition.Of(key, p.Count); got != p.Partition {
				t.Errorf("keys.json %s: partition %d of %d, the code's %d", v.Name, p.Partition, p.Count, got)
			}
		}
	}
	var jobs struct{ Vectors []jobVector }
	read("jobs.json", &jobs)
	for _, v := range jobs.Vectors {
		r := wire.Rules{Namespace: v.Namespace, Partition: v.Parsed.Partition, Partitions: v.Partitions, ReplyPrefix: v.ReplyPrefix}
		j, err := r.Parse(v.Message.Subject, v.Message.Headers)
		got := parsedJob{ID: j.ID, Key: j.Key, Type: j.Type, Reply: j.Reply, Idempotent: j.Idempotent, KeepOutcome: j.KeepOutcome, Partition: partition.Of(j.Key, v.Partitions)}
		if err != nil || got != v.Parsed || v.Message.Subject != partition.Subject(v.Namespace, got.Partition, v.Input.Key) {
			t.Errorf("jobs.json %s: the worker reads %+v (%v), the file says %+v", v.Name, got, err, v.Parsed)
		}
	}
	var batches struct{ Vectors []batchVector }
	read("batches.json", &batches)
	for _, v := range batches.Vectors {
		r := wire.Rules{Namespace: v.Namespace, Partition: v.Partition, Partitions: v.Partitions, ReplyPrefix: v.ReplyPrefix}
		es, err := r.ParseBatch(v.Message.Subject, v.Message.Headers, unhex(v.Message.BodyHex))
		if err != nil || len(es) != len(v.Jobs) {
			t.Errorf("batches.json %s: %d jobs read, %v", v.Name, len(es), err)
			continue
		}
		for i, e := range es {
			want := v.Jobs[i]
			h := hdrs(e.Header)
			if h == nil {
				h = hdrs{}
			}
			if e.Err != nil || e.Job.Key != want.Key || e.Job.ID != want.ID || e.Job.Type != want.Type || e.Job.Reply != want.Reply ||
				e.Job.KeepOutcome != want.KeepOutcome || e.Job.Idempotent != want.Idempotent || !reflect.DeepEqual(h, want.Headers) || hx(e.Payload) != want.PayloadHex {
				t.Errorf("batches.json %s job %d: the worker reads %+v %v (%v), the file says %+v", v.Name, i, e.Job, e.Header, e.Err, want)
			}
		}
	}
	var refusals struct{ Vectors []refusalVector }
	read("refusals.json", &refusals)
	for _, v := range refusals.Vectors {
		r := wire.Rules{Namespace: v.Rules.Namespace, Partition: v.Rules.Partition, Partitions: v.Rules.Partitions, ReplyPrefix: v.Rules.ReplyPrefix,
			Delays: v.Rules.Delays, DelaysStream: v.Rules.DelaysStream}
		var got []refusalEntry
		v.Headers = unhexHeaders(t, v.HeadersHex)
		switch v.MessageKind {
		case "job":
			j, err := r.Parse(v.Subject, v.Headers)
			if err != nil {
				got = append(got, newRefusal(-1, err, j.Reply))
			}
		case "delayed":
			at, perr := time.Parse(time.RFC3339Nano, v.Rules.StoredAt)
			if perr != nil {
				t.Fatal(perr)
			}
			d, err := r.ParseDelayed(v.Subject, v.Headers, at)
			if err != nil {
				got = append(got, newRefusal(-1, err, d.Reply))
			}
		case "batch":
			es, err := r.ParseBatch(v.Subject, v.Headers, unhex(v.BodyHex))
			if err != nil {
				got = append(got, newRefusal(-1, err, ""))
			}
			for i, e := range es {
				if e.Err != nil {
					got = append(got, newRefusal(i, e.Err, e.Job.Reply))
				}
			}
		default:
			t.Errorf("refusals.json %s: message kind %q", v.Name, v.MessageKind)
		}
		if !reflect.DeepEqual(got, v.Refusals) {
			t.Errorf("refusals.json %s: the worker refuses with %+v, the file says %+v", v.Name, got, v.Refusals)
		}
	}
	for name, check := range map[string]func(*testing.T, []byte){"delays.json": checkDelaysRead, "streams.json": checkStreamsRead} {
		b, err := os.ReadFile(filepath.Join(conformanceDir, name))
		if err != nil {
			t.Fatal(err)
		}
		check(t, b)
	}
	var outcomes struct{ Kept []keptVector }
	read("outcomes.json", &outcomes)
	for _, v := range outcomes.Kept {
		res, err, ok := decodeResult(unhex(v.ValueHex))
		kind, text := outcomeKind(err)
		if !ok || kind != v.Kind || text != v.Error || hx(res) != v.ResultHex {
			t.Errorf("outcomes.json %s: decodes to %s %q %x, the file says %s %q %s", v.Name, kind, text, res, v.Kind, v.Error, v.ResultHex)
		}
	}
	var replies struct {
		Single     []singleReplyVector
		Grouped    []groupedVector
		StreamAcks []streamAckVector `json:"stream_acks"`
	}
	read("replies.json", &replies)
	for _, v := range replies.Single {
		m := &nats.Msg{Header: nats.Header(v.Headers), Data: unhex(v.DataHex)}
		if got := decodeReplyVector(m); got != v.Decoded {
			t.Errorf("replies.json %s: decodes to %+v, the file says %+v", v.Name, got, v.Decoded)
		}
	}
	for _, v := range replies.StreamAcks {
		if got := ackClass(unhex(v.DataHex)); got != v.Class {
			t.Errorf("replies.json stream_acks %s: the client takes it as %s, the file says %s", v.Name, got, v.Class)
		}
	}
	for _, v := range replies.Grouped {
		outs, err := DecodeGroupedReply(unhex(v.BodyHex))
		if (err == nil) != v.Valid || len(outs) != len(v.Entries) {
			t.Errorf("replies.json %s: valid %v with %d entries, the file says %v with %d", v.Name, err == nil, len(outs), v.Valid, len(v.Entries))
			continue
		}
		for i, o := range outs {
			kind, text := outcomeKind(o.Err)
			if e := v.Entries[i]; o.Token != e.Token || kind != e.Kind || text != e.Error || hx(o.Result) != e.ResultHex {
				t.Errorf("replies.json %s entry %d: %s %s %q, the file says %+v", v.Name, i, o.Token, kind, text, e)
			}
		}
	}
}
