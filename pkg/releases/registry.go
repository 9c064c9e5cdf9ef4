package releases

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// DefaultTimeout bounds one repository's tag listing.
const DefaultTimeout = 30 * time.Second

// Registry is a compat.Resolver that finds the newest patch of a minor tagged in every
// one of Repositories.
type Registry struct {
	// Repositories are the repositories the release must be tagged in, as the nodes'
	// images name them ("registry.example.com:5000/mirror/kube-apiserver").
	Repositories []string
	// Options are go-containerregistry's remote options (credentials, transport);
	// none: the docker keychain.
	Options []remote.Option
	// Timeout bounds each repository's listing; 0 is DefaultTimeout.
	Timeout time.Duration
}

// KubernetesRepositories are the repositories of the five Kubernetes components' images
// in the machine configs of the nodes a path moves (held nodes apart), sorted.
func KubernetesRepositories(snap *discovery.Snapshot) []string {
	var out []string

	for _, n := range snap.Nodes {
		if n.Held || n.Talos == nil {
			continue
		}

		for _, c := range discovery.Components() {
			if repo := render.RepositoryOf(n.Talos.Images[c]); repo != "" && !slices.Contains(out, repo) {
				out = append(out, repo)
			}
		}
	}

	slices.Sort(out)

	return out
}

// NewestPatch implements compat.Resolver: it lists the tags of every repository and
// returns the newest vX.Y.Z of minor's major.minor that all of them carry.
func (r Registry) NewestPatch(ctx context.Context, minor compat.Version) (compat.Resolved, error) {
	repos := slices.Clone(r.Repositories)
	slices.Sort(repos)
	repos = slices.Compact(repos)

	if len(repos) == 0 {
		return compat.Resolved{}, fmt.Errorf("no repository to look v%s.<patch> up in (no node's machine config names an image)", minor.MinorString())
	}

	patches := make([][]compat.Version, len(repos))
	errs := make([]error, len(repos))

	var wg sync.WaitGroup

	for i, repo := range repos {
		wg.Go(func() { patches[i], errs[i] = r.patches(ctx, repo, minor) })
	}

	wg.Wait()

	for _, err := range errs {
		if err != nil {
			return compat.Resolved{}, err
		}
	}

	var missing []string

	common := patches[0]

	for i, p := range patches {
		if len(p) == 0 {
			missing = append(missing, repos[i])
		}

		common = slices.DeleteFunc(common, func(v compat.Version) bool { return !slices.Contains(p, v) })
	}

	switch {
	case len(missing) > 0:
		return compat.Resolved{}, fmt.Errorf("no v%s.<patch> tag in %s", minor.MinorString(), list(missing))
	case len(common) == 0:
		newest := make([]string, 0, len(repos))
		for i, repo := range repos {
			newest = append(newest, fmt.Sprintf("%s in %s", patches[i][len(patches[i])-1], repo))
		}

		return compat.Resolved{}, fmt.Errorf("no v%s.<patch> is tagged in every repository (newest %s)", minor.MinorString(), list(newest))
	}

	return compat.Resolved{
		Version: common[len(common)-1],
		Source:  api.SourceRegistry,
		Detail:  fmt.Sprintf("newest %s patch tagged in each of %s", minor.MinorString(), list(repos)),
	}, nil
}

// patches lists repo's tags and returns its releases of minor, oldest first.
func (r Registry) patches(ctx context.Context, repo string, minor compat.Version) ([]compat.Version, error) {
	ref, err := name.NewRepository(repo)
	if err != nil {
		return nil, fmt.Errorf("repository %q: %w", repo, err)
	}

	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	opts := r.Options
	if len(opts) == 0 {
		opts = []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	}

	tags, err := remote.List(ref, append(slices.Clone(opts), remote.WithContext(ctx))...)
	if err != nil {
		return nil, fmt.Errorf("list the tags of %s: %s", repo, text.OneLine(err.Error()))
	}

	var out []compat.Version

	for _, tag := range tags {
		if v, err := compat.ParseVersion(tag); err == nil && v.SameMinor(minor) {
			out = append(out, v)
		}
	}

	slices.SortFunc(out, compat.Version.Compare)

	return out, nil
}

// list joins names, at most a few.
func list(names []string) string {
	const shown = 5

	if len(names) <= shown {
		return strings.Join(names, ", ")
	}

	return fmt.Sprintf("%s and %d more", strings.Join(names[:shown], ", "), len(names)-shown)
}

// oneLine folds a registry's error (which may carry a response body) into one line.
