package machine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
)

// Mirror is a private registry of the cluster: the operator copied some Kubernetes
// releases of the five repositories the simulator knows (kubernetesRepositories) into
// it, under the same paths (<host>/kube-apiserver, ..., <host>/siderolabs/kubelet).
// It serves those releases and nothing else: a pull of a tag it does not hold fails as
// any registry's "not found" does, and its tags list (the OCI distribution API's
// /v2/<repo>/tags/list, which clients such as go-containerregistry's remote.List
// read) lists exactly the tags a pull would find, faults applied: both ask Holds.
type Mirror struct {
	// Host is the mirror's host:port, as image references name it.
	Host string
	// Releases are the Kubernetes releases it holds (vX.Y.Z), in each repository.
	Releases []string
	// Faults takes references away as from every registry (their unpublished list);
	// may be nil.
	Faults *faults.Store
}

// mirrorPaths are the paths of the simulator's Kubernetes repositories, kept on the
// mirror.
func mirrorPaths() []string {
	out := make([]string, 0, len(kubernetesRepositories))
	for _, repo := range kubernetesRepositories {
		out = append(out, repo[strings.Index(repo, "/")+1:])
	}
	return out
}

// Image returns image (one of the simulator's Kubernetes repositories) on the mirror,
// its path and tag kept; any other image as it is.
func (m *Mirror) Image(image string) string {
	for _, repo := range kubernetesRepositories {
		if rest, ok := strings.CutPrefix(image, repo+":"); ok {
			return m.Host + "/" + repo[strings.Index(repo, "/")+1:] + ":" + rest
		}
	}
	return image
}

// holds reports whether the mirror serves r (a reference on its host): one of its
// paths, at a release it holds (a digest-only reference: any of its images).
func (m *Mirror) holds(r imageRef) bool {
	if !slices.Contains(mirrorPaths(), r.path) {
		return false
	}
	return r.tag == "" || slices.Contains(m.Releases, r.tag) && knownKubernetes(r.tag)
}

// Tags lists what a pull of path would find, as the tags list API answers.
func (m *Mirror) Tags(path string) []string {
	tags := []string{}
	for _, tag := range m.Releases {
		r := imageRef{host: m.Host, path: path, tag: tag}
		if published(r, m.Faults.Unpublished(), m) == nil {
			tags = append(tags, tag)
		}
	}
	slices.Sort(tags)
	return tags
}

// tagsListPath matches the tags list API's path, /v2/<name>/tags/list.
var tagsListPath = regexp.MustCompile(`^/v2/(.+)/tags/list$`)

// Serve serves the mirror on l (a TLS listener, as a registry other than
// 127.0.0.1 or localhost must be for clients to use it; push trusts its
// certificate; nil: the default transport) until ctx ends: go-containerregistry's registry
// (pkg/registry, the in-memory OCI distribution implementation) holds a small image at
// each release of each path and serves the API (the /v2/ ping, manifests, blobs). Its
// tags list answers from its store, which the faults file cannot change, so the tags
// list is answered here, from Tags: the one rule pulls follow too.
func (m *Mirror) Serve(ctx context.Context, l net.Listener, push http.RoundTripper) error {
	store := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		match := tagsListPath.FindStringSubmatch(req.URL.Path)
		if match == nil || req.Method != http.MethodGet {
			store.ServeHTTP(w, req)
			return
		}
		if !slices.Contains(mirrorPaths(), match[1]) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known to registry"}]}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"name": match[1], "tags": m.Tags(match[1])})
	})}
	go func() { _ = srv.Serve(l) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if push == nil {
		push = remote.DefaultTransport
	}
	img, err := random.Image(64, 1)
	if err != nil {
		return err
	}
	for _, path := range mirrorPaths() {
		for _, tag := range m.Releases {
			ref, err := name.NewTag(m.Host + "/" + path + ":" + tag)
			if err != nil {
				return fmt.Errorf("mirror: %w", err)
			}
			if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithTransport(push)); err != nil {
				return fmt.Errorf("mirror: push %s: %w", ref, err)
			}
		}
	}
	return nil
}

// Images returns a machine config (YAML) with every image of the simulator's
// Kubernetes repositories moved to the mirror, its path and tag kept.
func (m *Mirror) Images(config []byte) []byte {
	for _, repo := range kubernetesRepositories {
		config = bytes.ReplaceAll(config, []byte(repo+":"), []byte(m.Image(repo+":")))
	}
	return config
}
