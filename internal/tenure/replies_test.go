package tenure

import (
	"strings"
	"testing"

	"github.com/keylane/keylane/wire"
)

// TestGroupedInboxTakesOnlyDecodableTokens: the worker groups only replies
// whose token the client's decoder accepts; anything else (a previous
// build's token, the grouped token itself, a foreign form) is replied to
// alone, for one such entry would make the client drop the whole message.
func TestGroupedInboxTakesOnlyDecodableTokens(t *testing.T) {
	for reply, want := range map[string]string{
		"_INBOX.abc.-1":   "_INBOX.abc.",
		"_INBOX.abc.-z9":  "_INBOX.abc.",
		"_INBOX.abc.1":    "",
		"_INBOX.abc.1a":   "",
		"_INBOX.abc.-":    "",
		"_INBOX.abc.-A":   "",
		"_INBOX.abc.-1_2": "",
		"_INBOX.abc.--1":  "",
		"-1":              "",
		"_INBOX.abc.-" + strings.Repeat("1", wire.GroupedTokenMax): "",
	} {
		got, ok := groupedInbox(reply)
		if got != want || ok != (want != "") {
			t.Errorf("groupedInbox(%q) = %q, %v; want %q", reply, got, ok, want)
		}
	}
}
