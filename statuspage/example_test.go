package statuspage_test

import (
	"log"
	"net/http"
	"time"

	"github.com/keylane/keylane/statuspage"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A service mounts the page of its namespace in its own HTTP server: the
// page at /keylane/, its JSON at /keylane/status.json.
func ExampleHandler() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	page, err := statuspage.Handler(js, statuspage.Config{Namespace: "shop", Timeout: 3 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/keylane/", http.StripPrefix("/keylane", page))
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
