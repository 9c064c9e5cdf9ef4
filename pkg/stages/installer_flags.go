package stages

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/gendata"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// InstallerFlags are the operator's say in the installers of a Talos
// upgrade: --installer-image IMAGE for every node and --installer-image
// NODE=IMAGE for one (an image reference has no "=", so the two read apart),
// and --drop-extensions NODE,... for the nodes whose explicit installer may
// leave out what they run (their schematic, their system extensions): its
// name says what is lost, and it names nodes, so that one image given to
// every node cannot strip a node nobody meant.
type InstallerFlags struct {
	// Image is the installer of every node without its own ("": each
	// node's is chosen from what it runs).
	Image string `json:"image,omitempty"`
	// Nodes are installers of single nodes, by node name.
	Nodes map[string]string `json:"nodes,omitempty"`
	// DropExtensions are the nodes whose explicit installer may drop what
	// they run.
	DropExtensions []string `json:"dropExtensions,omitempty"`
}

// ParseInstallerFlags reads the values of --installer-image and
// --drop-extensions, checking that every image is tagged target, the value of
// the flag targetFlag (--to, or --talos for a path).
func ParseInstallerFlags(images, drop []string, target Version, targetFlag string) (InstallerFlags, error) {
	var f InstallerFlags

	for _, v := range images {
		node, image, perNode := strings.Cut(v, "=")
		if !perNode {
			node, image = "", v
		}

		if perNode && node == "" {
			return InstallerFlags{}, fmt.Errorf("--installer-image %q: pass IMAGE for every node or NODE=IMAGE for one", v)
		}

		if err := checkInstallerTag(image, target, targetFlag); err != nil {
			return InstallerFlags{}, err
		}

		switch {
		case !perNode && f.Image != "":
			return InstallerFlags{}, fmt.Errorf("--installer-image is given twice for every node (%s, %s): pass one, and NODE=IMAGE for the nodes that differ", f.Image, image)
		case !perNode:
			f.Image = image
		case f.Nodes[node] != "":
			return InstallerFlags{}, fmt.Errorf("--installer-image is given twice for node %s (%s, %s): pass one", node, f.Nodes[node], image)
		default:
			if f.Nodes == nil {
				f.Nodes = map[string]string{}
			}

			f.Nodes[node] = image
		}
	}

	for _, n := range drop {
		if n = strings.TrimSpace(n); n == "" {
			return InstallerFlags{}, fmt.Errorf("--drop-extensions: name the nodes, e.g. --drop-extensions worker-1,worker-2")
		}

		if !slices.Contains(f.DropExtensions, n) {
			f.DropExtensions = append(f.DropExtensions, n)
		}
	}

	return f, nil
}

// Retag returns the installers for a path's Talos hop to another version: the same ones, each repository kept
// and tagged to (an image the operator gave for the path's Talos target serves each Talos
// hop on the way).
func (f InstallerFlags) Retag(to Version) (InstallerFlags, error) {
	retag := func(image string) (string, error) {
		out, err := render.WithTag(image, to.String())
		if err != nil {
			return "", fmt.Errorf("--installer-image %q: %w", image, err)
		}

		return out, nil
	}

	out := InstallerFlags{DropExtensions: slices.Clone(f.DropExtensions)}

	if f.Image != "" {
		image, err := retag(f.Image)
		if err != nil {
			return InstallerFlags{}, err
		}

		out.Image = image
	}

	for node, image := range f.Nodes {
		image, err := retag(image)
		if err != nil {
			return InstallerFlags{}, err
		}

		if out.Nodes == nil {
			out.Nodes = map[string]string{}
		}

		out.Nodes[node] = image
	}

	return out, nil
}

// checkInstallerTag checks an installer image is tagged with the target, the
// value of targetFlag.
func checkInstallerTag(image string, target Version, targetFlag string) error {
	tag := render.TagOf(image)
	if tag == "" {
		return fmt.Errorf("--installer-image %q: pass REPOSITORY:TAG, e.g. %s/%s/%s:%s", image, gendata.ImageFactory, "metal-installer", EmptySchematic, target)
	}

	if v, err := ParseVersion(tag); err == nil && v != target {
		return fmt.Errorf("--installer-image %q is tagged %s but %s is %s: make them agree", image, tag, targetFlag, target)
	}

	return nil
}

// For returns node's explicit installer ("" when none).
func (f InstallerFlags) For(node string) string {
	if image := f.Nodes[node]; image != "" {
		return image
	}

	return f.Image
}

// Drops reports whether node's explicit installer may drop what it runs.
func (f InstallerFlags) Drops(node string) bool { return slices.Contains(f.DropExtensions, node) }

// CheckNodes refuses flags that name a node the cluster does not have.
func (f InstallerFlags) CheckNodes(snap *discovery.Snapshot) error {
	for _, n := range slices.Sorted(maps.Keys(f.Nodes)) {
		if _, ok := snap.Node(n); !ok {
			return fmt.Errorf("--installer-image %s=%s: the cluster has no node %q", n, f.Nodes[n], n)
		}
	}

	for _, n := range f.DropExtensions {
		if _, ok := snap.Node(n); !ok {
			return fmt.Errorf("--drop-extensions %s: the cluster has no node %q", n, n)
		}

		if f.For(n) == "" {
			return fmt.Errorf("--drop-extensions %s: no --installer-image is given for it: the installer chosen for a node without one keeps what it runs", n)
		}
	}

	return nil
}
