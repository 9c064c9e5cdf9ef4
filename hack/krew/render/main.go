// Command render renders the checked-in krew.yaml template into a plugin
// manifest the way krew-release-bot renders it for the krew index at a
// release: Go template syntax with {{ .TagName }}, addURIAndSha and indent.
// The only difference is where a platform's sha256 comes from: the archive
// of the same file name in -assets, instead of a download of its URI.
//
//	render -template krew.yaml -tag v0.1.0 -assets _output/dist -out _output/dist/ichor.yaml
//
// With -platforms os/arch,... the manifest keeps only those platforms, for a
// build of fewer archives than a release (make test builds this machine's
// only); a release renders every platform of the template.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "render: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	tmpl := fs.String("template", "krew.yaml", "the manifest template")
	tag := fs.String("tag", "", "the release tag, e.g. v0.1.0")
	assets := fs.String("assets", "", "the directory holding the release archives")
	dst := fs.String("out", "", "the rendered manifest (its file name must be <plugin>.yaml)")
	only := fs.String("platforms", "", "keep only these platforms, os/arch separated by commas or spaces (default: every platform of the template)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tag == "" || *assets == "" || *dst == "" {
		return fmt.Errorf("-tag, -assets and -out are required")
	}

	r := renderer{assets: *assets, only: map[string]bool{}}
	for _, p := range strings.FieldsFunc(*only, func(c rune) bool { return c == ',' || c == ' ' }) {
		r.only[p] = true
	}
	b, err := r.render(*tmpl, values{TagName: *tag, PluginOwner: "ichor-dev", PluginRepo: "kubectl-ichor"})
	if err != nil {
		return err
	}
	if len(r.only) > 0 {
		if b, err = keepPlatforms(b, r.only); err != nil {
			return err
		}
	}
	if err := os.WriteFile(*dst, b, 0o644); err != nil {
		return err
	}
	for _, u := range r.used {
		fmt.Fprintf(out, "render: %s -> %s\n", u.uri, u.sha256)
	}
	fmt.Fprintf(out, "render: %s (%d platforms)\n", *dst, len(r.used))

	return nil
}

// values are the fields krew-release-bot passes to the template (its
// ReleaseRequest); the template uses TagName only.
type values struct {
	TagName     string
	PluginOwner string
	PluginRepo  string
}

type asset struct{ uri, sha256 string }

type renderer struct {
	assets string
	// only, when not empty, is the platforms (os/arch) to keep.
	only map[string]bool
	used []asset
}

func (r *renderer) render(file string, v values) ([]byte, error) {
	t, err := template.New(filepath.Base(file)).Funcs(template.FuncMap{
		"indent":       indent,
		"addURIAndSha": r.addURIAndSha,
	}).Option("missingkey=error").ParseFiles(file)
	if err != nil {
		return nil, fmt.Errorf("template %s: %w", file, err)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, v); err != nil {
		return nil, fmt.Errorf("template %s: %w", file, err)
	}

	return buf.Bytes(), nil
}

// addURIAndSha expands {{ .TagName }} and {{ .Version }} in uri, and returns
// the uri and the sha256 of the local archive with the same file name, as
// two YAML lines, the second indented by 4 spaces (krew-release-bot's output).
func (r *renderer) addURIAndSha(uri, tag string) (string, error) {
	t, err := template.New("uri").Parse(uri)
	if err != nil {
		return "", fmt.Errorf("uri %q: %w", uri, err)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, struct{ TagName, Version string }{tag, versionFromTag(tag)}); err != nil {
		return "", fmt.Errorf("uri %q: %w", uri, err)
	}
	u, err := url.Parse(buf.String())
	if err != nil {
		return "", fmt.Errorf("uri %q: %w", buf.String(), err)
	}
	file := filepath.Join(r.assets, path.Base(u.Path))
	if len(r.only) > 0 && !r.only[platformOf(path.Base(u.Path))] {
		// Dropped by keepPlatforms: no archive needed.
		return fmt.Sprintf("uri: %s\n    sha256: %s", buf.String(), strings.Repeat("0", 64)), nil
	}
	sum, err := sha256File(file)
	if err != nil {
		return "", fmt.Errorf("uri %s: no local archive (run hack/dist.sh): %w", buf.String(), err)
	}
	r.used = append(r.used, asset{uri: buf.String(), sha256: sum})

	return fmt.Sprintf("uri: %s\n    sha256: %s", buf.String(), sum), nil
}

// platformOf is the os/arch of an archive named
// kubectl-ichor_<version>_<os>_<arch>.<ext>, as hack/dist.sh names them.
func platformOf(archive string) string {
	name := strings.TrimSuffix(strings.TrimSuffix(archive, ".tar.gz"), ".zip")
	parts := strings.Split(name, "_")
	if len(parts) < 2 {
		return ""
	}

	return parts[len(parts)-2] + "/" + parts[len(parts)-1]
}

// keepPlatforms returns the manifest with only the platforms whose selector
// matches an os/arch of only; it fails when one of only is not there.
func keepPlatforms(manifest []byte, only map[string]bool) ([]byte, error) {
	var m map[string]any
	if err := yaml.Unmarshal(manifest, &m); err != nil {
		return nil, fmt.Errorf("rendered manifest: %w", err)
	}
	spec, _ := m["spec"].(map[string]any)
	platforms, _ := spec["platforms"].([]any)
	var kept []any
	found := map[string]bool{}
	for _, p := range platforms {
		labels, _ := p.(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any)
		key := fmt.Sprintf("%v/%v", labels["os"], labels["arch"])
		if only[key] {
			kept = append(kept, p)
			found[key] = true
		}
	}
	for p := range only {
		if !found[p] {
			return nil, fmt.Errorf("-platforms %s: the template has no such platform", p)
		}
	}
	spec["platforms"] = kept

	return yaml.Marshal(m)
}

func sha256File(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}

	return hex.EncodeToString(h.Sum(nil)), nil
}

// indent is krew-release-bot's indent: v with every line indented by spaces,
// trimmed at both ends, for use after a key already at that indentation.
func indent(spaces int, v string) string {
	v = strings.ReplaceAll(v, "    sha256:", "sha256:")
	pad := strings.Repeat(" ", spaces)

	return strings.TrimSpace(pad + strings.ReplaceAll(v, "\n", "\n"+pad))
}

// versionFromTag is the tag's dotted version without a prefix, "1.2.3" for
// "v1.2.3", or the tag itself.
func versionFromTag(tag string) string {
	if v := regexp.MustCompile(`\d+(\.\d+)+`).FindString(tag); v != "" {
		return v
	}

	return tag
}
