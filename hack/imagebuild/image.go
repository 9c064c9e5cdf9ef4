package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// BinaryPath is where the image holds the plugin; the Job's command is
	// [BinaryPath, "run", ...].
	BinaryPath = "/usr/local/bin/kubectl-ichor"
	// UID and GID are the non-root user and group the image runs as, the
	// "nonroot" of distroless images.
	UID, GID = 65532, 65532
	// Home is the non-root user's home directory.
	Home = "/home/nonroot"
)

// Binary is a static linux binary of the plugin for one platform.
type Binary struct {
	Platform v1.Platform
	Path     string
}

func (b Binary) String() string { return b.Platform.String() + "=" + b.Path }

// Spec is what Build makes an image of.
type Spec struct {
	// Binaries are the plugin's binaries, one image each; the first is the
	// one a `docker load` of the tarball gets.
	Binaries []Binary
	// Created is the images' creation time and every file's modification
	// time, so that the same binaries give the same digests.
	Created time.Time
	// Labels are the images' OCI annotations-as-labels.
	Labels map[string]string
}

// PlatformImage is the image of one platform.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// Built is Build's result: an image per platform and, for more than one,
// the index of them all.
type Built struct {
	Images []PlatformImage
	Index  v1.ImageIndex
}

// Digest is the digest a registry knows the result by: the index's if there
// is one, else the single image's.
func (b *Built) Digest() (v1.Hash, error) {
	if b.Index != nil {
		return b.Index.Digest()
	}

	return b.Images[0].Image.Digest()
}

// Build makes one image per binary and, for several, their index.
func Build(spec Spec) (*Built, error) {
	built := &Built{}
	adds := make([]mutate.IndexAddendum, 0, len(spec.Binaries))
	for _, bin := range spec.Binaries {
		if bin.Platform.OS != "linux" {
			return nil, fmt.Errorf("%s: the image is for linux only", bin)
		}
		img, err := buildImage(bin, spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", bin, err)
		}
		p := bin.Platform
		built.Images = append(built.Images, PlatformImage{Platform: p, Image: img})
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	if len(adds) > 1 {
		built.Index = mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	}

	return built, nil
}

func buildImage(bin Binary, spec Spec) (v1.Image, error) {
	b, err := os.ReadFile(bin.Path)
	if err != nil {
		return nil, err
	}
	if err := checkStaticELF(b, bin.Platform); err != nil {
		return nil, err
	}
	fs, err := rootFS(b, spec.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(fs)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}

	created := v1.Time{Time: spec.Created}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: bin.Platform.Architecture,
		Variant:      bin.Platform.Variant,
		OS:           bin.Platform.OS,
		Created:      created,
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: []string{BinaryPath},
			User:       fmt.Sprintf("%d:%d", UID, GID),
			Env:        []string{"PATH=/usr/local/bin", "HOME=" + Home},
			WorkingDir: Home,
			Labels:     spec.Labels,
		},
	})
	if err != nil {
		return nil, err
	}

	return mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: "hack/imagebuild: " + BinaryPath + ", user " + fmt.Sprint(UID)},
	})
}

// rootFS is the image's only layer: the directories, the user's entries
// and the binary, owned by root except the user's home, in a fixed order.
func rootFS(binary []byte, mtime time.Time) ([]byte, error) {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:%s:/sbin/nologin\n", UID, GID, Home)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", GID)
	entries := []struct {
		name     string
		mode     int64
		uid, gid int
		data     []byte // nil for a directory
	}{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: UID, gid: GID},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/local/", mode: 0o755},
		{name: "usr/local/bin/", mode: 0o755},
		{name: BinaryPath[1:], mode: 0o755, data: binary},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatUSTAR}
		if e.data == nil {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}

	return buf.Bytes(), nil
}

// checkStaticELF checks that b is an ELF executable for the platform's
// architecture without a program interpreter, which a dynamically linked
// binary would need and the image does not have.
func checkStaticELF(b []byte, p v1.Platform) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("not an ELF binary: %w", err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM,
		"386": elf.EM_386, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV}[p.Architecture]
	if f.Machine != want {
		return fmt.Errorf("built for %s, not %s", f.Machine, p.Architecture)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("dynamically linked (build it with CGO_ENABLED=0)")
		}
	}

	return nil
}
