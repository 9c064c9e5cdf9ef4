//go:build e2e

package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The distribution tests check what `make dist` and `make image` leave in
// _output (or in $ICHOR_DIST, $ICHOR_TOOLS and $ICHOR_IMAGE): the archives
// and krew manifest installed with a real krew and run through kubectl's
// plugin discovery, and the Job's image opened by hand, its binary run, and
// where a Docker engine runs, loaded and run there too.

const (
	imageRepository = "ghcr.io/ichor-dev/kubectl-ichor"
	imageBinary     = "/usr/local/bin/kubectl-ichor"
	imageUser       = "65532:65532"
)

// distRepoRoot is the repository's root: the tests run in e2e/.
func distRepoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// distArtifact is $name if set, else def under the repository root; it fails the
// test with what to run when the path does not exist.
func distArtifact(t *testing.T, name, def, how string) string {
	t.Helper()
	p := os.Getenv(name)
	if p == "" {
		p = filepath.Join(distRepoRoot(t), def)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%v: build it with %s (or set $%s)", err, how, name)
	}
	return p
}

// distVersion is the version hack/dist.sh stamps for this tree (and
// $VERSION), which make dist and make image built.
func distVersion(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(distRepoRoot(t), "hack", "dist.sh"), "version").Output()
	if err != nil {
		t.Fatalf("hack/dist.sh version: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// runTool runs a command with env added to the test's environment and returns
// its combined output, failing the test if it fails.
func runTool(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// krewManifest is the part of a krew plugin manifest the tests read.
type krewManifest struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version   string `json:"version"`
		Platforms []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			Sha256 string `json:"sha256"`
			Bin    string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestDistKrewInstall installs every platform's archive from the rendered
// manifest with a real krew into its own KREW_ROOT (KREW_OS/KREW_ARCH pick
// the platform), and on this machine's platform through `kubectl krew`, then
// runs `kubectl ichor version` found by kubectl's plugin discovery.
func TestDistKrewInstall(t *testing.T) {
	t.Parallel()

	dist := distArtifact(t, "ICHOR_DIST", "_output/dist", "make dist")
	tools := distArtifact(t, "ICHOR_TOOLS", "_output/tools", "make dist")
	kubectl := filepath.Join(env(t, "ICHOR_CLUSTER_BINS"), "kubectl")
	krew := filepath.Join(tools, "krew")
	version := distVersion(t)
	manifestPath := filepath.Join(dist, "ichor.yaml")

	b, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatalf("%v: run make dist", err)
	}
	var m krewManifest
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", manifestPath, err)
	}
	if m.Metadata.Name != "ichor" || m.Spec.Version != version {
		t.Fatalf("%s: plugin %q at %q, want ichor at %q (run make dist)", manifestPath, m.Metadata.Name, m.Spec.Version, version)
	}
	sums := readChecksums(t, filepath.Join(dist, "kubectl-ichor_"+version+"_checksums.txt"))

	// The template lists every release platform; the manifest those built
	// (make test builds this machine's, make dist all six).
	tmpl, err := os.ReadFile(filepath.Join(distRepoRoot(t), "krew.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"linux_amd64", "linux_arm64", "darwin_amd64", "darwin_arm64", "windows_amd64", "windows_arm64"} {
		if !strings.Contains(string(tmpl), "_"+p+".") {
			t.Errorf("krew.yaml has no archive for %s", p)
		}
	}
	var want []string
	for archive := range sums {
		parts := strings.Split(strings.TrimSuffix(strings.TrimSuffix(archive, ".tar.gz"), ".zip"), "_")
		want = append(want, parts[len(parts)-2]+"/"+parts[len(parts)-1])
	}
	var got []string
	for _, p := range m.Spec.Platforms {
		got = append(got, p.Selector.MatchLabels["os"]+"/"+p.Selector.MatchLabels["arch"])
	}
	if len(got) == 0 || !sameSet(got, want) {
		t.Fatalf("manifest platforms %v, want those of the archives built %v", got, want)
	}
	if host := runtime.GOOS + "/" + runtime.GOARCH; !slices.Contains(got, host) {
		t.Fatalf("manifest platforms %v: none for this machine (%s): run make dist-host", got, host)
	}

	for _, p := range m.Spec.Platforms {
		goos, goarch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		t.Run(goos+"_"+goarch, func(t *testing.T) {
			prefix := "https://github.com/ichor-dev/kubectl-ichor/releases/download/" + version + "/"
			if !strings.HasPrefix(p.URI, prefix) {
				t.Errorf("uri %s: want it under %s", p.URI, prefix)
			}
			archive := filepath.Join(dist, path.Base(p.URI))
			data, err := os.ReadFile(archive)
			if err != nil {
				t.Fatal(err)
			}
			if sum := sha256Hex(data); sum != p.Sha256 || sums[path.Base(p.URI)] != sum {
				t.Fatalf("%s: sha256 %s, manifest says %s, checksums say %s", archive, sum, p.Sha256, sums[path.Base(p.URI)])
			}

			root := t.TempDir()
			runTool(t, []string{"KREW_ROOT=" + root, "KREW_OS=" + goos, "KREW_ARCH=" + goarch, "KREW_NO_UPGRADE_CHECK=1"},
				krew, "install", "--manifest="+manifestPath, "--archive="+archive)
			store := filepath.Join(root, "store", "ichor", version)
			for _, f := range []string{p.Bin, "LICENSE"} {
				if _, err := os.Stat(filepath.Join(store, f)); err != nil {
					t.Errorf("installed plugin: %v", err)
				}
			}
			if _, err := os.Lstat(filepath.Join(root, "bin", "kubectl-ichor"+strings.TrimPrefix(p.Bin, "kubectl-ichor"))); err != nil {
				t.Errorf("krew's bin link: %v", err)
			}
		})
	}

	t.Run("kubectl ichor version", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skipf("kubectl is built for linux here, this is %s", runtime.GOOS)
		}
		archive := filepath.Join(dist, fmt.Sprintf("kubectl-ichor_%s_linux_%s.tar.gz", version, runtime.GOARCH))
		// kubectl finds krew as the plugin kubectl-krew, and then ichor in $KREW_ROOT/bin.
		root, pathDir, home := t.TempDir(), t.TempDir(), t.TempDir()
		if err := os.Symlink(krew, filepath.Join(pathDir, "kubectl-krew")); err != nil {
			t.Fatal(err)
		}
		env := []string{
			"KREW_ROOT=" + root, "KREW_NO_UPGRADE_CHECK=1", "HOME=" + home, "KUBECONFIG=" + filepath.Join(home, "none"),
			"PATH=" + pathDir + string(os.PathListSeparator) + filepath.Join(root, "bin") + string(os.PathListSeparator) + os.Getenv("PATH"),
		}
		out := runTool(t, env, kubectl, "krew", "install", "--manifest="+manifestPath, "--archive="+archive)
		t.Logf("kubectl krew install:\n%s", out)
		if !strings.Contains(out, `Installed plugin: ichor`) {
			t.Errorf("kubectl krew install did not say it installed ichor")
		}
		// (kubectl krew list wants a plugin index, which needs git and GitHub.)
		if _, err := os.Stat(filepath.Join(root, "receipts", "ichor.yaml")); err != nil {
			t.Errorf("krew's receipt of ichor: %v", err)
		}
		out = runTool(t, env, kubectl, "plugin", "list")
		if !strings.Contains(out, filepath.Join(root, "bin", "kubectl-ichor")) {
			t.Errorf("kubectl plugin list does not find kubectl-ichor in $KREW_ROOT/bin:\n%s", out)
		}
		if out := strings.TrimSpace(runTool(t, env, kubectl, "ichor", "version")); out != version {
			t.Errorf("kubectl ichor version = %q, want %q", out, version)
		}
	})
}

// readChecksums reads a sha256sum file into file name -> sum.
func readChecksums(t *testing.T, name string) map[string]string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatalf("%v: run make dist", err)
	}
	defer f.Close()
	sums := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if sum, file, ok := strings.Cut(s.Text(), "  "); ok {
			sums[file] = sum
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return sums
}

// ociDescriptor, ociIndex, ociManifest and ociConfig are the parts of the
// OCI image spec's documents the tests read, decoded here by hand rather
// than with the library that wrote them.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type ociIndex struct {
	SchemaVersion int             `json:"schemaVersion"`
	Manifests     []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Config    ociDescriptor   `json:"config"`
	Layers    []ociDescriptor `json:"layers"`
}

type ociConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		User       string            `json:"User"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// imageTarball is an OCI image tarball read into memory.
type imageTarball map[string][]byte

func readImageTarball(t *testing.T, name string) imageTarball {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := imageTarball{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[hdr.Name] = b
		}
	}
}

// blob returns the blob d names, checking its size and digest.
func (f imageTarball) blob(t *testing.T, d ociDescriptor) []byte {
	t.Helper()
	algo, hex, _ := strings.Cut(d.Digest, ":")
	b, ok := f["blobs/"+algo+"/"+hex]
	if !ok {
		t.Fatalf("no blob %s in the tarball", d.Digest)
	}
	if int64(len(b)) != d.Size || "sha256:"+sha256Hex(b) != d.Digest {
		t.Fatalf("blob %s: %d bytes with sha256:%s, descriptor says %d bytes", d.Digest, len(b), sha256Hex(b), d.Size)
	}
	return b
}

func unmarshalJSON(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestImageTarball opens the Job's image tarball: the OCI layout names the
// image of this version, the entrypoint is the static binary, the user is
// not root, the layer has no shell, and the binary run from it prints this
// version and carries the image's own reference as its default image. Where
// a Docker engine runs, the image is loaded and run there too.
func TestImageTarball(t *testing.T) {
	t.Parallel()

	tarball := distArtifact(t, "ICHOR_IMAGE", "_output/image/kubectl-ichor.tar", "make image")
	version := distVersion(t)
	ref := imageRepository + ":" + version
	files := readImageTarball(t, tarball)

	if got := string(files["oci-layout"]); !strings.Contains(got, `"imageLayoutVersion":"1.0.0"`) {
		t.Errorf("oci-layout = %q", got)
	}
	var index ociIndex
	unmarshalJSON(t, "index.json", files["index.json"], &index)
	if index.SchemaVersion != 2 || len(index.Manifests) != 1 {
		t.Fatalf("index.json: want schemaVersion 2 and one image, got %+v", index)
	}
	top := index.Manifests[0]
	if name := top.Annotations["io.containerd.image.name"]; name != ref {
		t.Fatalf("index.json names %q, want %q (run make image)", name, ref)
	}
	if tag := top.Annotations["org.opencontainers.image.ref.name"]; tag != version {
		t.Errorf("index.json ref.name %q, want %q", tag, version)
	}
	// One platform's image, or the index of several: take this machine's.
	desc := top
	if top.MediaType == "application/vnd.oci.image.index.v1+json" {
		var platforms ociIndex
		unmarshalJSON(t, "image index", files.blob(t, top), &platforms)
		desc = ociDescriptor{}
		for _, d := range platforms.Manifests {
			if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				desc = d
			}
		}
		if desc.Digest == "" {
			t.Fatalf("the image index has no linux/%s image", runtime.GOARCH)
		}
	}
	if desc.MediaType != "application/vnd.oci.image.manifest.v1+json" {
		t.Fatalf("manifest media type %q", desc.MediaType)
	}
	var manifest ociManifest
	unmarshalJSON(t, "manifest", files.blob(t, desc), &manifest)
	var cfg ociConfig
	unmarshalJSON(t, "config", files.blob(t, manifest.Config), &cfg)

	if strings.Join(cfg.Config.Entrypoint, " ") != imageBinary || len(cfg.Config.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want [%s] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd, imageBinary)
	}
	if cfg.Config.User != imageUser {
		t.Errorf("user %q, want %q (non-root)", cfg.Config.User, imageUser)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	if v := cfg.Config.Labels["org.opencontainers.image.version"]; v != version {
		t.Errorf("label org.opencontainers.image.version %q, want %q", v, version)
	}

	// The layers: their diff IDs, no shell, the binary.
	if len(manifest.Layers) != len(cfg.RootFS.DiffIDs) {
		t.Fatalf("%d layers, %d diff IDs", len(manifest.Layers), len(cfg.RootFS.DiffIDs))
	}
	var binary []byte
	var names []string
	for i, l := range manifest.Layers {
		gz, err := gzip.NewReader(bytes.NewReader(files.blob(t, l)))
		if err != nil {
			t.Fatalf("layer %s: %v", l.Digest, err)
		}
		layer, err := io.ReadAll(gz)
		if err != nil {
			t.Fatalf("layer %s: %v", l.Digest, err)
		}
		if d := "sha256:" + sha256Hex(layer); d != cfg.RootFS.DiffIDs[i] {
			t.Errorf("layer %s: diff ID %s, config says %s", l.Digest, d, cfg.RootFS.DiffIDs[i])
		}
		tr := tar.NewReader(bytes.NewReader(layer))
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			name := "/" + strings.TrimPrefix(path.Clean(hdr.Name), "/")
			names = append(names, name)
			switch {
			case path.Base(name) == "sh" || path.Base(name) == "bash" || path.Base(name) == "busybox":
				t.Errorf("the image has a shell: %s", name)
			case name == imageBinary:
				if hdr.Mode&0o111 == 0 || hdr.Uid != 0 {
					t.Errorf("%s: mode %o uid %d, want executable and owned by root", name, hdr.Mode, hdr.Uid)
				}
				if binary, err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	t.Logf("image %s: %s", ref, strings.Join(names, " "))
	if binary == nil {
		t.Fatalf("no %s in the image", imageBinary)
	}

	// The binary: static, this version, stamped with its own image.
	bin := filepath.Join(t.TempDir(), "kubectl-ichor")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked", imageBinary)
		}
	}
	ef.Close()
	if out := strings.TrimSpace(runTool(t, nil, bin, "version")); out != version {
		t.Errorf("%s version = %q, want %q", imageBinary, out, version)
	}
	// The Job's default image is this very image: `upgrade kubernetes --help`
	// shows the default of --image.
	help, err := exec.Command(bin, "upgrade", "kubernetes", "--help").CombinedOutput()
	switch {
	case err != nil && bytes.Contains(help, []byte(`unknown command "upgrade"`)):
		t.Logf("this build has no upgrade command yet: its default --image is not checked")
	case err != nil:
		t.Errorf("%s upgrade kubernetes --help: %v\n%s", imageBinary, err, help)
	case !bytes.Contains(help, []byte(`"`+ref+`"`)):
		t.Errorf("upgrade kubernetes --help does not give %s as the default --image:\n%s", ref, help)
	}

	// The docker save side: manifest.json tags the image.
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	unmarshalJSON(t, "manifest.json", files["manifest.json"], &docker)
	if len(docker) != 1 || strings.Join(docker[0].RepoTags, " ") != ref || docker[0].Config == "" {
		t.Errorf("manifest.json = %+v, want one image tagged %s", docker, ref)
	}

	t.Run("docker", func(t *testing.T) { testImageInDocker(t, tarball, ref, version) })
}

// testImageInDocker loads the tarball into the local Docker engine and runs
// the image's version command, and a shell that must not be there.
func testImageInDocker(t *testing.T, tarball, ref, version string) {
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker client on PATH")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers here (docker info: %v: %s)", err, bytes.TrimSpace(out))
	}
	out := runTool(t, nil, "docker", "load", "-i", tarball)
	t.Cleanup(func() {
		if out, err := exec.Command("docker", "rmi", "-f", ref).CombinedOutput(); err != nil {
			t.Logf("docker rmi %s: %v: %s", ref, err, out)
		}
	})
	if !strings.Contains(out, "Loaded image: "+ref) {
		t.Errorf("docker load: %s, want it to load %s", strings.TrimSpace(out), ref)
	}
	if user := strings.TrimSpace(runTool(t, nil, "docker", "image", "inspect", "--format", "{{.Config.User}}", ref)); user != imageUser {
		t.Errorf("docker: user %q, want %q", user, imageUser)
	}
	if out := strings.TrimSpace(runTool(t, nil, "docker", "run", "--rm", "--network", "none", ref, "version")); out != version {
		t.Errorf("docker run %s version = %q, want %q", ref, out, version)
	}
	if out, err := exec.Command("docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", ref, "-c", "true").CombinedOutput(); err == nil {
		t.Errorf("docker run --entrypoint /bin/sh worked: the image has a shell\n%s", out)
	}
}
