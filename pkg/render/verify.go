package render

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"sigs.k8s.io/yaml"
)

// UnexpectedChangeError is returned by Verify when two machine configs differ
// somewhere else than the allowed image tags.
type UnexpectedChangeError struct {
	// Paths are the differences, sorted: a v1alpha1 path such as
	// "cluster.network.cni.name", another document's path prefixed with the
	// document ("HostnameConfig: hostname"), or an image path with the
	// reason ("cluster.apiServer.image: repository changed").
	Paths []string
}

// Error implements error.
func (e *UnexpectedChangeError) Error() string {
	return fmt.Sprintf("the machine config differs outside the Kubernetes image tags, at %s: ichor changes "+
		"only image tags; settle that change with talosctl (the node's config: "+
		"`talosctl get machineconfig v1alpha1 -o yaml`) and run again", strings.Join(e.Paths, ", "))
}

// Verify returns an *UnexpectedChangeError naming every path at which after
// differs from before, other than the image of an allowed component; with no
// component given, all five are allowed, each only in the layout before keeps
// it in (see LayoutOf). Even an allowed image must keep its repository: only
// its tag (and digest) may change. Every document of a
// multi-document config is compared, matched by kind and name.
func Verify(before, after config.Provider, allowed ...Component) error {
	if len(allowed) == 0 {
		allowed = Components()
	}

	return verify(before, after, allowed)
}

// verify is Verify where an empty allowed list allows nothing.
func verify(before, after config.Provider, allowed []Component) error {
	if before == nil || after == nil {
		return errors.New("verify: no machine config")
	}

	paths, err := diffPaths(before, after)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}

	// An image may change only where before keeps it: a render that moved
	// it to the other layout shows as a document added or a section
	// removed, and is refused.
	imagePaths := map[string]Component{}
	for _, c := range allowed {
		imagePaths[c.PathIn(LayoutOf(before, c))] = c
	}

	beforeImages, afterImages := Images(before), Images(after)

	var bad []string

	for _, p := range paths {
		c, ok := imagePaths[p]
		if !ok {
			bad = append(bad, p)

			continue
		}

		from, to := RepositoryOf(beforeImages[c]), RepositoryOf(afterImages[c])
		if from != to {
			bad = append(bad, fmt.Sprintf("%s: repository changed from %q to %q", p, from, to))
		}
	}

	if len(bad) > 0 {
		slices.Sort(bad)

		return &UnexpectedChangeError{Paths: bad}
	}

	return nil
}

// diffPaths compares two configs document by document, field by field, and
// returns the path of every leaf that differs.
func diffPaths(before, after config.Provider) ([]string, error) {
	a, aKeys, err := documentTrees(before)
	if err != nil {
		return nil, err
	}

	b, bKeys, err := documentTrees(after)
	if err != nil {
		return nil, err
	}

	var paths []string

	for _, key := range aKeys {
		if _, ok := b[key]; !ok {
			paths = append(paths, docPrefix(key)+"(document removed)")

			continue
		}

		paths = diffTree(paths, docPrefix(key), a[key], b[key])
	}

	for _, key := range bKeys {
		if _, ok := a[key]; !ok {
			paths = append(paths, docPrefix(key)+"(document added)")
		}
	}

	return paths, nil
}

// v1alpha1Key is the key of the v1alpha1 document, whose paths are written
// without a prefix.
const v1alpha1Key = ""

func docPrefix(key string) string {
	if key == v1alpha1Key {
		return ""
	}

	return key + ": "
}

// documentTrees encodes every document and decodes it into a generic tree,
// keyed by kind (and name, for a named document).
func documentTrees(cfg config.Provider) (map[string]any, []string, error) {
	trees := map[string]any{}

	var keys []string

	for _, doc := range cfg.Documents() {
		key := doc.Kind()
		if key == "v1alpha1" {
			key = v1alpha1Key
		} else if named, ok := doc.(coreconfig.NamedDocument); ok {
			key += "/" + named.Name()
		}

		// Keys are unique in a valid container; a repeat (such as a delete
		// selector next to its document) gets a counter rather than hiding.
		base := key
		for n := 2; ; n++ {
			if _, seen := trees[key]; !seen {
				break
			}

			key = base + "#" + strconv.Itoa(n)
		}

		b, err := encoder.NewEncoder(doc, encoder.WithComments(encoder.CommentsDisabled)).Encode()
		if err != nil {
			return nil, nil, fmt.Errorf("encode document %s: %w", doc.Kind(), err)
		}

		var tree any
		if err := yaml.Unmarshal(b, &tree); err != nil {
			return nil, nil, fmt.Errorf("decode document %s: %w", doc.Kind(), err)
		}

		trees[key] = tree
		keys = append(keys, key)
	}

	return trees, keys, nil
}

// diffTree appends to paths every leaf path under prefix where a and b differ.
// A subtree present on one side only is reported leaf by leaf, so a section
// created to hold an image reads as its image path.
func diffTree(paths []string, prefix string, a, b any) []string {
	am, aIsMap := a.(map[string]any)
	bm, bIsMap := b.(map[string]any)

	switch {
	case aIsMap && bIsMap:
		keys := make([]string, 0, len(am)+len(bm))
		for k := range am {
			keys = append(keys, k)
		}

		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}

		slices.Sort(keys)

		for _, k := range keys {
			paths = diffTree(paths, joinPath(prefix, k), am[k], bm[k])
		}

		return paths
	case aIsMap && b == nil:
		return diffTree(paths, prefix, a, map[string]any{})
	case a == nil && bIsMap:
		return diffTree(paths, prefix, map[string]any{}, b)
	}

	al, aIsList := a.([]any)
	bl, bIsList := b.([]any)

	if aIsList && bIsList && len(al) == len(bl) {
		for i := range al {
			paths = diffTree(paths, fmt.Sprintf("%s[%d]", prefix, i), al[i], bl[i])
		}

		return paths
	}

	if !reflect.DeepEqual(a, b) {
		paths = append(paths, prefix)
	}

	return paths
}

// joinPath appends a key to a path: "cluster" + "apiServer" is
// "cluster.apiServer"; a key with a dot or a space is quoted
// (machine.nodeLabels["node.kubernetes.io/exclude"]).
func joinPath(prefix, key string) string {
	if strings.ContainsAny(key, ". []\"") {
		return prefix + "[" + strconv.Quote(key) + "]"
	}

	if prefix == "" || strings.HasSuffix(prefix, ": ") {
		return prefix + key
	}

	return prefix + "." + key
}
