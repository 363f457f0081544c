package docs_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestLicenseIsApache2 holds the licence in place: the Apache License 2.0
// at the root and beside each module that is published on its own, and the
// same licence named in the Node package and the README.
func TestLicenseIsApache2(t *testing.T) {
	for _, f := range []string{"../LICENSE", "../pg/LICENSE", "../bench/LICENSE", "../clients/node/LICENSE"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("%s: %v (every module carries the licence)", f, err)
		}
		text := string(b)
		for _, want := range []string{"Apache License", "Version 2.0, January 2004", "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "END OF TERMS AND CONDITIONS"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %q: not the full Apache-2.0 text", f, want)
			}
		}
	}
	b, err := os.ReadFile("../clients/node/package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		License string `json:"license"`
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatalf("clients/node/package.json: %v", err)
	}
	if pkg.License != "Apache-2.0" {
		t.Errorf("clients/node/package.json licence = %q, want Apache-2.0", pkg.License)
	}
	if !strings.Contains(read(t, "README.md"), "[Apache License 2.0](LICENSE)") {
		t.Error("README.md does not name its licence with a link to LICENSE")
	}
}
