package main

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// hello builds a tiny static linux program for arch, standing in for the plugin.
func hello(t *testing.T, arch string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", "hello", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return filepath.Join(dir, "hello")
}

func TestBuildTarballAndPush(t *testing.T) {
	amd64, arm64 := hello(t, "amd64"), hello(t, "arm64")
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	out := filepath.Join(t.TempDir(), "image.tar")

	var stdout bytes.Buffer
	args := []string{"-tag", host + "/ichor/kubectl-ichor:v0.1.0", "-created", "1700000000", "-out", out, "-push",
		"-binary", "linux/amd64=" + amd64, "-binary", "linux/arm64=" + arm64}
	if err := run(t.Context(), args, &stdout); err != nil {
		t.Fatal(err)
	}
	t.Log(stdout.String())

	// The registry holds a valid index of both platforms.
	ref, err := name.NewTag(host+"/ichor/kubectl-ichor:v0.1.0", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("pushed index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range im.Manifests {
		platforms = append(platforms, d.Platform.String())
	}
	if got := strings.Join(platforms, " "); got != "linux/amd64 linux/arm64" {
		t.Errorf("pushed platforms %q", got)
	}

	// The tarball's docker side is the first platform's image, with the same
	// digest as the one pushed, and it is valid.
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("tarball image: %v", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Architecture != "amd64" || cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != BinaryPath {
		t.Errorf("config: %s, user %q, entrypoint %q", cfg.Architecture, cfg.Config.User, cfg.Config.Entrypoint)
	}
	// docker's manifest.json has no manifest of its own: compare the configs.
	pushed, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pushed.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := img.ConfigName(); err != nil || got != want {
		t.Errorf("tarball image config %s (%v), pushed linux/amd64 config %s", got, err, want)
	}

	// The same inputs give the same bytes.
	again := filepath.Join(t.TempDir(), "image.tar")
	args = []string{"-tag", host + "/ichor/kubectl-ichor:v0.1.0", "-created", "1700000000", "-out", again,
		"-binary", "linux/amd64=" + amd64, "-binary", "linux/arm64=" + arm64}
	if err := run(t.Context(), args, &stdout); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same binaries differ")
	}
}

func TestBuildRefusesWrongBinaries(t *testing.T) {
	amd64 := hello(t, "amd64")
	for _, tc := range []struct{ name, binary, want string }{
		{name: "wrong arch", binary: "linux/arm64=" + amd64, want: "built for EM_X86_64, not arm64"},
		{name: "not linux", binary: "darwin/amd64=" + amd64, want: "linux only"},
		{name: "not ELF", binary: "linux/amd64=" + filepath.Join(filepath.Dir(amd64), "go.mod"), want: "not an ELF binary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(t.Context(), []string{"-tag", "example.com/x:v1", "-out", filepath.Join(t.TempDir(), "x.tar"), "-binary", tc.binary}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to say %q", err, tc.want)
			}
		})
	}
}
