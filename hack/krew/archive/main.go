// Command archive writes a release archive for krew: a .tar.gz, or a .zip
// for Windows, holding the given files at its top level under their base
// names, owned by root, with the given modification time and nothing else
// from the machine, so the same inputs give the same bytes (and sha256).
//
//	archive -out kubectl-ichor_v0.1.0_linux_amd64.tar.gz -mtime 1700000000 kubectl-ichor LICENSE
package main

import (
	"archive/tar"
	"archive/zip"
	"compress/flate"
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "archive: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("archive", flag.ContinueOnError)
	out := fs.String("out", "", "the archive to write: NAME.tar.gz or NAME.zip")
	mtime := fs.Int64("mtime", 0, "the modification time of every entry, in seconds since the epoch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() == 0 {
		return fmt.Errorf("usage: archive -out NAME.tar.gz|NAME.zip [-mtime SECONDS] FILE...")
	}

	tmp := *out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)

	when := time.Unix(*mtime, 0).UTC()
	switch {
	case strings.HasSuffix(*out, ".tar.gz"):
		err = writeTarGz(f, when, fs.Args())
	case strings.HasSuffix(*out, ".zip"):
		err = writeZip(f, when, fs.Args())
	default:
		err = fmt.Errorf("%s: the name must end in .tar.gz or .zip", *out)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", *out, err)
	}

	return os.Rename(tmp, *out)
}

// mode is 0755 for a file that anyone may execute, 0644 otherwise.
func mode(fi os.FileInfo) int64 {
	if fi.Mode()&0o111 != 0 {
		return 0o755
	}

	return 0o644
}

func writeTarGz(w io.Writer, when time.Time, files []string) error {
	gz, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	for _, name := range files {
		err := addFile(name, func(fi os.FileInfo, r io.Reader) error {
			hdr := &tar.Header{
				Typeflag: tar.TypeReg,
				Name:     filepath.Base(name),
				Mode:     mode(fi),
				Size:     fi.Size(),
				ModTime:  when,
				Format:   tar.FormatUSTAR,
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			_, err := io.Copy(tw, r)

			return err
		})
		if err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}

	return gz.Close()
}

func writeZip(w io.Writer, when time.Time, files []string) error {
	zw := zip.NewWriter(w)
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.DefaultCompression)
	})
	for _, name := range files {
		err := addFile(name, func(fi os.FileInfo, r io.Reader) error {
			hdr := &zip.FileHeader{Name: filepath.Base(name), Method: zip.Deflate, Modified: when}
			hdr.SetMode(os.FileMode(mode(fi)))
			fw, err := zw.CreateHeader(hdr)
			if err != nil {
				return err
			}
			_, err = io.Copy(fw, r)

			return err
		})
		if err != nil {
			return err
		}
	}

	return zw.Close()
}

func addFile(name string, add func(os.FileInfo, io.Reader) error) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", name)
	}
	if err := add(fi, f); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}

	return nil
}
