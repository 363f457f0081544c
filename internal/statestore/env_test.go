package statestore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/keylane/keylane/internal/natstest"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// env is a state bucket on an in-process server, as Setup makes it (file
// storage, history 1).
type env struct {
	nc *nats.Conn
	js jetstream.JetStream
	kv jetstream.KeyValue
}

const testBucket = "TEST_STATE"

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := natstest.Start(t)
	nc := natstest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: testBucket, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return &env{nc: nc, js: js, kv: kv}
}

// store is a Store on e's bucket that knows its connection (the root's
// Topology.NewState without epochs).
func (e *env) store() *Store { return New(Config{KV: e.kv, Conn: e.nc}) }

// allowAtomicPublish lets the bucket's stream take atomic batches, as a
// worker with StateBatch does.
func (e *env) allowAtomicPublish(t *testing.T) {
	t.Helper()
	s, err := e.js.Stream(ctx(t), "KV_"+testBucket)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.AllowAtomicPublish = true
	if _, err := e.js.UpdateStream(ctx(t), sc); err != nil {
		t.Fatal(err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func add(n int) UpdateFunc {
	return func(cur []byte) ([]byte, []byte, error) {
		v, _ := strconv.Atoi(string(cur))
		v += n
		return []byte(strconv.Itoa(v)), []byte("now " + strconv.Itoa(v)), nil
	}
}
