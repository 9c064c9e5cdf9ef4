package stages

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// OrderOptions are the inputs of OrderNodes besides the nodes.
type OrderOptions struct {
	// Self is the name of the node that runs the Job; it goes last in its group. May be empty.
	Self string
	// MaxUnavailable is how many workers move at once; below 1 means 1.
	MaxUnavailable int
	// Done reports a node that already runs the target: it is shown apart and not visited.
	// nil means no node is done.
	Done func(discovery.Node) bool
}

// Order is the nodes of an upgrade in the order they are visited.
type Order struct {
	// ControlPlanes are visited one at a time, in this order.
	ControlPlanes []discovery.Node
	// Workers are visited a batch at a time, the batches in this order.
	Workers [][]discovery.Node
	// Held are excluded by the hold annotation, by name.
	Held []discovery.Node
	// Done already run the target, by name.
	Done []discovery.Node
}

// OrderNodes orders nodes by the rules every upgrade shares: held nodes are excluded;
// within control planes and within workers, nodes with the order label come first by its
// integer value, then the rest, ties by name; the node that runs the Job is last in its
// group; workers are cut into batches of MaxUnavailable. A label that is not an integer is
// an error naming the node.
func OrderNodes(nodes []discovery.Node, opts OrderOptions) (Order, error) {
	var (
		out            Order
		cps, wks       []discovery.Node
		keyOf          = map[string]orderKey{}
		maxUnavailable = max(opts.MaxUnavailable, 1)
	)

	for _, n := range nodes {
		k, err := keyFor(n, opts.Self)
		if err != nil {
			return Order{}, err
		}

		keyOf[n.Name] = k

		switch {
		case n.Held:
			out.Held = append(out.Held, n)
		case opts.Done != nil && opts.Done(n):
			out.Done = append(out.Done, n)
		case n.ControlPlane:
			cps = append(cps, n)
		default:
			wks = append(wks, n)
		}
	}

	less := func(list []discovery.Node) func(i, j int) bool {
		return func(i, j int) bool { return keyOf[list[i].Name].less(keyOf[list[j].Name]) }
	}

	sort.SliceStable(cps, less(cps))
	sort.SliceStable(wks, less(wks))
	sort.SliceStable(out.Held, func(i, j int) bool { return out.Held[i].Name < out.Held[j].Name })
	sort.SliceStable(out.Done, func(i, j int) bool { return out.Done[i].Name < out.Done[j].Name })

	out.ControlPlanes = cps

	for start := 0; start < len(wks); start += maxUnavailable {
		out.Workers = append(out.Workers, wks[start:min(start+maxUnavailable, len(wks))])
	}

	return out, nil
}

// orderKey sorts: self last, then labelled before unlabelled, then by label, then by name.
type orderKey struct {
	self     bool
	labelled bool
	order    int64
	name     string
}

func (a orderKey) less(b orderKey) bool {
	switch {
	case a.self != b.self:
		return b.self
	case a.labelled != b.labelled:
		return a.labelled
	case a.order != b.order:
		return a.order < b.order
	}

	return a.name < b.name
}

func keyFor(n discovery.Node, self string) (orderKey, error) {
	k := orderKey{self: self != "" && n.Name == self, name: n.Name}

	if n.Order == "" {
		return k, nil
	}

	v, err := strconv.ParseInt(n.Order, 10, 64)
	if err != nil {
		return orderKey{}, fmt.Errorf("node %q: label %s=%q is not an integer: set it to an integer (kubectl label node %s %s=1 --overwrite) or remove it",
			n.Name, discovery.OrderLabel, n.Order, n.Name, discovery.OrderLabel)
	}

	k.labelled, k.order = true, v

	return k, nil
}
