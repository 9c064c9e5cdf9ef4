// Command imagebuild builds the container image the in-cluster Job runs,
// without a Docker daemon, from binaries already built (hack/image.sh):
// one layer holding the static binary at /usr/local/bin/kubectl-ichor, the
// passwd and group entries of the non-root user 65532 and a /tmp, and
// nothing else: no shell, no package manager. The entrypoint is the binary,
// the user 65532:65532.
//
// It writes one tarball that is both an OCI image layout (oci-layout,
// index.json, blobs/sha256/...) and a `docker save` archive (manifest.json
// naming the first platform's image), so `docker load`, `podman load`,
// `skopeo copy oci-archive:` and `crane push` all read it. With -push it
// also pushes the image, or the index of all platforms, to the tag's
// registry with the credentials of ~/.docker/config.json.
//
//	imagebuild -tag ghcr.io/ichor-dev/kubectl-ichor:v0.1.0 \
//	  -binary linux/amd64=_output/dist/bin/linux_amd64/kubectl-ichor \
//	  -out _output/image/kubectl-ichor.tar [-push]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "imagebuild: %v\n", err)
		os.Exit(1)
	}
}

// binaryFlags collects repeated -binary OS/ARCH=PATH flags in order.
type binaryFlags []Binary

func (b *binaryFlags) String() string { return fmt.Sprint(*b) }

func (b *binaryFlags) Set(v string) error {
	plat, path, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("%q: want OS/ARCH=PATH", v)
	}
	p, err := v1.ParsePlatform(plat)
	if err != nil {
		return fmt.Errorf("%q: %w", v, err)
	}
	*b = append(*b, Binary{Platform: *p, Path: path})

	return nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("imagebuild", flag.ContinueOnError)
	var bins binaryFlags
	fs.Var(&bins, "binary", "OS/ARCH=PATH of a static linux binary for that platform (repeat for several platforms)")
	tag := fs.String("tag", "", "the image reference, e.g. ghcr.io/ichor-dev/kubectl-ichor:v0.1.0")
	dst := fs.String("out", "", "the OCI image tarball to write (skipped if empty)")
	push := fs.Bool("push", false, "push the image (one platform) or the image index (several) to -tag's registry")
	version := fs.String("version", "", "the version, for the org.opencontainers.image.version label (default: the tag)")
	revision := fs.String("revision", "", "the source revision, for the org.opencontainers.image.revision label")
	created := fs.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "the image's creation time in seconds since the epoch (default $SOURCE_DATE_EPOCH, else 0)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(bins) == 0 || *tag == "" || (*dst == "" && !*push) {
		return fmt.Errorf("usage: imagebuild -tag REF -binary OS/ARCH=PATH... [-out FILE] [-push]")
	}
	ref, err := name.NewTag(*tag, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", *tag, err)
	}
	when := time.Unix(0, 0).UTC()
	if *created != "" {
		secs, err := strconv.ParseInt(*created, 10, 64)
		if err != nil {
			return fmt.Errorf("-created %q: %w", *created, err)
		}
		when = time.Unix(secs, 0).UTC()
	}
	if *version == "" {
		*version = ref.TagStr()
	}

	spec := Spec{
		Binaries: bins,
		Created:  when,
		Labels: map[string]string{
			"org.opencontainers.image.title":       "kubectl-ichor",
			"org.opencontainers.image.description": "The in-cluster Job of kubectl-ichor, which upgrades Talos Linux clusters",
			"org.opencontainers.image.source":      "https://github.com/ichor-dev/kubectl-ichor",
			"org.opencontainers.image.licenses":    "Apache-2.0",
			"org.opencontainers.image.version":     *version,
		},
	}
	if *revision != "" {
		spec.Labels["org.opencontainers.image.revision"] = *revision
	}
	built, err := Build(spec)
	if err != nil {
		return err
	}

	if *dst != "" {
		if err := WriteTarball(*dst, ref, built); err != nil {
			return fmt.Errorf("write %s: %w", *dst, err)
		}
		fi, err := os.Stat(*dst)
		if err != nil {
			return err
		}
		digest, err := built.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "imagebuild: %s: %s (%s, %d bytes)\n", *dst, ref, digest, fi.Size())
	}

	if *push {
		opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
		if built.Index != nil {
			err = remote.WriteIndex(ref, built.Index, opts...)
		} else {
			err = remote.Write(ref, built.Images[0].Image, opts...)
		}
		if err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		digest, err := built.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "imagebuild: pushed %s@%s\n", ref, digest)
	}

	return nil
}
