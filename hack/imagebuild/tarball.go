package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// dockerManifest is one entry of a `docker save` archive's manifest.json.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// tarWriter writes a tarball's files once each, with fixed metadata.
type tarWriter struct {
	tw      *tar.Writer
	written map[string]bool
}

func (w *tarWriter) dir(name string) error {
	return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR})
}

func (w *tarWriter) file(name string, size int64, r io.Reader) error {
	if w.written[name] {
		return nil
	}
	w.written[name] = true
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(w.tw, r)
	if err == nil && n != size {
		err = fmt.Errorf("%s: wrote %d bytes, want %d", name, n, size)
	}

	return err
}

func (w *tarWriter) bytes(name string, b []byte) error {
	return w.file(name, int64(len(b)), bytes.NewReader(b))
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// image writes an image's layers, config and manifest as blobs, and
// returns its docker manifest.json entry.
func (w *tarWriter) image(img v1.Image) (dockerManifest, error) {
	var dm dockerManifest
	layers, err := img.Layers()
	if err != nil {
		return dm, err
	}
	for _, l := range layers {
		digest, err := l.Digest()
		if err != nil {
			return dm, err
		}
		size, err := l.Size()
		if err != nil {
			return dm, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return dm, err
		}
		err = w.file(blobPath(digest), size, rc)
		rc.Close()
		if err != nil {
			return dm, err
		}
		dm.Layers = append(dm.Layers, blobPath(digest))
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return dm, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return dm, err
	}
	if err := w.bytes(blobPath(cfgName), cfg); err != nil {
		return dm, err
	}
	dm.Config = blobPath(cfgName)
	digest, err := img.Digest()
	if err != nil {
		return dm, err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return dm, err
	}

	return dm, w.bytes(blobPath(digest), manifest)
}

// WriteTarball writes built as one tarball that is an OCI image layout whose
// index.json names ref, and also a `docker save` archive whose manifest.json
// tags the first platform's image as ref (docker load takes one image per tag).
func WriteTarball(path string, ref name.Tag, built *Built) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)

	w := &tarWriter{tw: tar.NewWriter(f), written: map[string]bool{}}
	if err := writeLayout(w, ref, built); err != nil {
		f.Close()
		return err
	}
	if err := w.tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}

	return os.Rename(tmp, path)
}

func writeLayout(w *tarWriter, ref name.Tag, built *Built) error {
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := w.dir(d); err != nil {
			return err
		}
	}
	var docker []dockerManifest
	for i, pi := range built.Images {
		dm, err := w.image(pi.Image)
		if err != nil {
			return fmt.Errorf("%s: %w", pi.Platform, err)
		}
		if i == 0 {
			dm.RepoTags = []string{ref.String()}
			docker = append(docker, dm)
		}
	}

	// The one descriptor index.json holds: the index of all platforms, or
	// the only image's manifest.
	var desc v1.Descriptor
	if built.Index != nil {
		raw, err := built.Index.RawManifest()
		if err != nil {
			return err
		}
		digest, err := built.Index.Digest()
		if err != nil {
			return err
		}
		if err := w.bytes(blobPath(digest), raw); err != nil {
			return err
		}
		desc = v1.Descriptor{MediaType: types.OCIImageIndex, Size: int64(len(raw)), Digest: digest}
	} else {
		img := built.Images[0]
		raw, err := img.Image.RawManifest()
		if err != nil {
			return err
		}
		digest, err := img.Image.Digest()
		if err != nil {
			return err
		}
		p := img.Platform
		desc = v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: int64(len(raw)), Digest: digest, Platform: &p}
	}
	desc.Annotations = map[string]string{
		"io.containerd.image.name":          ref.String(),
		"org.opencontainers.image.ref.name": ref.TagStr(),
	}
	index, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: []v1.Descriptor{desc}})
	if err != nil {
		return err
	}
	if err := w.bytes("index.json", index); err != nil {
		return err
	}
	manifest, err := json.Marshal(docker)
	if err != nil {
		return err
	}
	if err := w.bytes("manifest.json", manifest); err != nil {
		return err
	}

	return w.bytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
}
