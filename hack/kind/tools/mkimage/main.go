// Command mkimage writes a one-layer container image of local files as a
// `docker save` tarball, which `ctr images import` and `docker load` take:
// the kind node image's component images are made with it, with no Docker
// daemon and no registry.
//
//	mkimage -tag registry.k8s.io/pause:3.10.2 -out pause.tar \
//	  -add /path/to/pause=/pause -entrypoint /pause
//
// -add SRC=DST copies a file or, for a directory, its whole tree (symbolic
// links kept) to DST in the image.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var adds, env, entrypoint list
	tag := flag.String("tag", "", "the image's reference, e.g. registry.k8s.io/pause:3.10.2")
	out := flag.String("out", "", "the tarball to write")
	flag.Var(&adds, "add", "SRC=DST: a file or directory tree to put at DST (repeatable)")
	flag.Var(&env, "env", "NAME=VALUE in the image's environment (repeatable)")
	flag.Var(&entrypoint, "entrypoint", "the entrypoint, one argument per flag (repeatable)")
	flag.Parse()
	if *tag == "" || *out == "" || len(adds) == 0 {
		fmt.Fprintln(os.Stderr, "mkimage: give -tag, -out and at least one -add SRC=DST")
		os.Exit(2)
	}
	if err := run(*tag, *out, adds, env, entrypoint); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(tag, out string, adds, env, entrypoint []string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// Every image gets a /tmp, as a Linux program may expect.
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	dirs := map[string]bool{"tmp": true}
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("-add %q: want SRC=DST", a)
		}
		if err := add(tw, dirs, src, strings.TrimPrefix(path.Clean(dst), "/")); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch()
	cf.Created = v1.Time{Time: time.Unix(0, 0)}
	cf.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	cf.Config.Entrypoint = entrypoint
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// add writes src (a file, or a directory's tree) at dst, with every parent
// directory first.
func add(tw *tar.Writer, dirs map[string]bool, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		if target == "." || target == "" {
			return nil
		}
		if err := parents(tw, dirs, path.Dir(target)); err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: target, Mode: int64(info.Mode().Perm()), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, link
			return tw.WriteHeader(hdr)
		case info.IsDir():
			if dirs[target] {
				return nil
			}
			dirs[target] = true
			hdr.Typeflag, hdr.Name = tar.TypeDir, target+"/"
			return tw.WriteHeader(hdr)
		case info.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
}

func parents(tw *tar.Writer, dirs map[string]bool, dir string) error {
	if dir == "." || dir == "/" || dir == "" || dirs[dir] {
		return nil
	}
	if err := parents(tw, dirs, path.Dir(dir)); err != nil {
		return err
	}
	dirs[dir] = true
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX})
}
