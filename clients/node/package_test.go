package nodeclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNodePackage packs the client as a registry or a git install gets
// it and uses it as an application would. From a copy of the package's
// sources alone (no dist: a git checkout), npm pack must build the code
// (the prepare script) and pack the CommonJS build with its type
// declarations, source maps and the TypeScript sources they point to,
// and package.json must carry the licence, the repository and the NATS
// packages as peer ranges. Installed into an application, the package
// must work from an ES module (import, named exports) and from CommonJS
// (require) on the node under test (KEYLANE_NODE: the package's minimum,
// node 18, in CI on Debian 12), against a real server and Go workers;
// with --enable-source-maps an error's stack names the TypeScript source.
func TestNodePackage(t *testing.T) {
	node, npm := needNode(t)
	build(t, npm) // node_modules for the copy's build
	if v, err := exec.Command(node, "--version").CombinedOutput(); err != nil {
		t.Fatalf("%s --version: %v: %s", node, err, v)
	} else {
		t.Logf("the application runs on node %s", bytes.TrimSpace(v))
	}
	src, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}

	// The sources, as a clone has them: no node_modules (linked to this
	// folder's), no dist.
	checkout := filepath.Join(t.TempDir(), "client")
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() && (rel == "node_modules" || rel == "dist") {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(checkout, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(checkout, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(src, "node_modules"), filepath.Join(checkout, "node_modules")); err != nil {
		t.Fatal(err)
	}
	packs := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "pack", "--json", "--pack-destination", packs)
	cmd.Dir = checkout
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("npm pack from the sources: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	var packed []struct {
		Filename string
		Files    []struct{ Path string }
	}
	// npm prints the build's output before its JSON.
	text := out.String()
	if err := json.Unmarshal([]byte(text[strings.Index(text, "\n[")+1:]), &packed); err != nil || len(packed) != 1 {
		t.Fatalf("npm pack --json printed %q: %v", text, err)
	}
	var files []string
	for _, f := range packed[0].Files {
		files = append(files, f.Path)
	}
	for _, want := range []string{"package.json", "README.md", "LICENSE", "dist/cjs/package.json", "dist/cjs/index.js", "dist/cjs/index.d.ts",
		"dist/cjs/index.js.map", "dist/cjs/index.d.ts.map", "dist/cjs/client.js", "dist/cjs/client.js.map", "src/client.ts", "src/index.ts"} {
		if !slices.Contains(files, want) {
			t.Errorf("the package lacks %s: %v", want, files)
		}
	}
	for _, f := range files {
		if strings.HasPrefix(f, "test/") || strings.HasPrefix(f, "dist/test/") || strings.HasPrefix(f, "scripts/") || strings.HasSuffix(f, ".go") || strings.HasPrefix(f, "node_modules/") {
			t.Errorf("the package carries %s", f)
		}
	}
	var meta struct {
		License          string
		Repository       struct{ Type, URL, Directory string }
		Engines          map[string]string
		Dependencies     map[string]string
		PeerDependencies map[string]string
		Scripts          map[string]string
	}
	b, err := os.ReadFile("package.json")
	if err == nil {
		err = json.Unmarshal(b, &meta)
	}
	if err != nil {
		t.Fatal(err)
	}
	if meta.License != "Apache-2.0" || meta.Repository.URL == "" || meta.Repository.Directory != "clients/node" {
		t.Errorf("package.json: license %q, repository %+v", meta.License, meta.Repository)
	}
	if meta.Scripts["prepare"] == "" {
		t.Error("package.json: no prepare script (a git install would get no code)")
	}
	for _, p := range []string{"@nats-io/nats-core", "@nats-io/jetstream", "@nats-io/kv", "@nats-io/transport-node"} {
		if r := meta.PeerDependencies[p]; !strings.HasPrefix(r, "^") {
			t.Errorf("package.json: peer dependency %s %q, want a caret range", p, r)
		}
		if _, pinned := meta.Dependencies[p]; pinned {
			t.Errorf("package.json: %s in dependencies (a copy of its own)", p)
		}
	}

	// An application with the package installed from the tarball, its
	// peers (the NATS packages) beside it.
	app := t.TempDir()
	mods := filepath.Join(app, "node_modules")
	if err := os.MkdirAll(filepath.Join(mods, "@keylane", "client"), 0o755); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(packs, packed[0].Filename)
	if b, err := exec.CommandContext(ctx, "tar", "-xzf", tarball, "-C", filepath.Join(mods, "@keylane", "client"), "--strip-components=1").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, b)
	}
	if err := os.Symlink(filepath.Join(src, "node_modules", "@nats-io"), filepath.Join(mods, "@nats-io")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(src, "node_modules", "@types"), filepath.Join(mods, "@types")); err != nil {
		t.Fatal(err)
	}
	// Its TypeScript, an ES module and a CommonJS one, type-checks
	// against the package's declarations (moduleResolution NodeNext).
	for name, code := range map[string]string{
		"tsconfig.json": `{"compilerOptions": {"module": "NodeNext", "moduleResolution": "NodeNext", "target": "ES2022", "strict": true, "noEmit": true, "types": ["node"]}, "files": ["typed.mts", "typed.cts"]}`,
		"typed.mts": `import { connect, KeylaneError, type JobOptions, type Submitted } from "@keylane/client";
const opts: JobOptions = { id: "order-1", signal: new AbortController().signal, delay: 1000 };
const c = await connect({ servers: "127.0.0.1:4222" });
const out: Submitted[] = await c.submitMany([{ key: "k", payload: "p", ...opts }]);
if (out[0].error instanceof KeylaneError) console.log(out[0].error.code);
`,
		"typed.cts": `import kl = require("@keylane/client");
export async function f(): Promise<string> {
  const c = await kl.connect({ namespace: "shop" });
  return c.submit("k", new Uint8Array(1), { runAt: new Date() });
}
`,
	} {
		if err := os.WriteFile(filepath.Join(app, name), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tsc := exec.CommandContext(ctx, node, filepath.Join(src, "node_modules", "typescript", "bin", "tsc"), "-p", app)
	if b, err := tsc.CombinedOutput(); err != nil {
		t.Fatalf("tsc on an application's TypeScript: %v\n%s", err, b)
	}
	l := startSale(t, "pkgtest")
	u, err := url.Parse(l.URL)
	if err != nil {
		t.Fatal(err)
	}
	const body = `
const c = await connect({ servers: %q, namespace: "pkgtest" });
try {
  const res = await c.call("sku:pkg-%s", "set 7", { timeout: 20000 });
  console.log("result", Buffer.from(res).toString());
  try {
    await c.submit("", "x");
  } catch (err) {
    console.log("refused", err instanceof KeylaneError, err.code);
    console.log(err.stack);
  }
} finally {
  await c.close();
}
`
	for _, p := range []struct{ file, head, body string }{
		{"app.mjs", `import { connect, KeylaneError } from "@keylane/client";`, body},
		{"app.cjs", `const { connect, KeylaneError } = require("@keylane/client");` + "\n(async () => {", body + "})().catch((err) => { console.error(err); process.exitCode = 1; });"},
	} {
		t.Run(p.file, func(t *testing.T) {
			code := p.head + "\n" + strings.ReplaceAll(strings.Replace(p.body, "%q", `"`+u.Host+`"`, 1), "%s", p.file)
			if err := os.WriteFile(filepath.Join(app, p.file), []byte(code), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(ctx, node, "--enable-source-maps", p.file)
			cmd.Dir = app
			got, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("node %s: %v\n%s", p.file, err, got)
			}
			t.Logf("node %s:\n%s", p.file, got)
			for _, want := range []string{"result ok 7", "refused true bad_key", "src/wire.ts:"} {
				if !strings.Contains(string(got), want) {
					t.Errorf("node %s printed no %q", p.file, want)
				}
			}
		})
	}
}
