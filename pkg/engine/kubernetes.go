package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// talosReadTimeout bounds one read of a node's Talos side (version, config,
// manifests); applies, pulls and waits have their own bounds in
// Options.
const talosReadTimeout = time.Minute

// Actions the pauses of the Kubernetes upgrade suggest.
const (
	actionResume      = "fix the cause, then resume (kubectl ichor resume)"
	actionTalosAccess = "check the node's Talos API is reachable with the credentials (talosctl -n <node> version), then resume"
)

// kubeRun is one Run of a Kubernetes upgrade.
type kubeRun struct {
	e       *Engine
	opts    Options
	target  stages.Version
	cache   *kube.Cache
	applier *kube.ManifestApplier
	// base is the invariant as judged at the stage's start: no apply may make it worse.
	base stages.Invariant
	// known are the nodes the stage read at its start: a control plane not among
	// them joined the cluster since (see joinedError).
	known map[string]bool
	// restarts counts the times the stage started again because control planes
	// joined, and joins how often each did (see runJoined).
	restarts int
	joins    map[string]int
}

// joinedError stops a stage when a control plane joined the cluster after the stage
// read it: its components run its own config's versions, behind the cluster, so the
// stage reads the cluster again and takes it first (from the APIServers stage) rather
// than pause on the skew the join brought.
type joinedError struct{ nodes []string }

func (e *joinedError) Error() string {
	return "control plane joined during the stage: " + strings.Join(e.nodes, ", ")
}

// joined returns the control planes of running (an apiserver, its version read or
// not) that the stage did not read at its start, or a joinedError naming them.
func (r *kubeRun) joined(running []kube.Running) error {
	if r.known == nil {
		return nil
	}

	var nodes []string

	for _, run := range running {
		if run.Component == discovery.APIServer && !r.known[run.Node] && !slices.Contains(nodes, run.Node) {
			nodes = append(nodes, run.Node)
		}
	}

	if len(nodes) == 0 {
		return nil
	}

	slices.Sort(nodes)

	return &joinedError{nodes: nodes}
}

// waitJoined waits, bounded by the verify timeout, until each joined control plane's
// Node is Ready and its apiserver shows its version (a control plane that just registered its
// Node starts its static pods next). At the bound the stage goes on, and its
// invariant check says what it cannot read.
func (r *kubeRun) waitJoined(ctx context.Context, stage string, nodes []string) error {
	err := r.cache.Wait(ctx, r.opts.VerifyTimeout, func() (bool, string) {
		for _, name := range nodes {
			if node, ok := r.cache.Node(name); !ok || !nodeReady(node) {
				return false, fmt.Sprintf("Node %s to be Ready", name)
			}
		}

		for _, run := range r.cache.Running() {
			if run.Component != discovery.APIServer || !slices.Contains(nodes, run.Node) {
				continue
			}

			if _, err := stages.ParseVersion(run.Version); err != nil {
				return false, fmt.Sprintf("kube-apiserver on %s to show its version", run.Node)
			}
		}

		return true, ""
	}, func(waiting string) { r.e.step(stage, "joined", "waiting for %s", waiting) })

	var timeout *kube.WaitTimeoutError
	if errors.As(err, &timeout) {
		return nil
	}

	return err
}

// stageNode is a node a stage visits, as read at the stage's start.
type stageNode struct {
	discovery.Node
	// changes are what the stage's render changes on the node, as read at
	// the stage's start.
	changes []render.Change
	// planned is that render, from the active config whose hash is
	// plannedFrom; a visit that finds the same config and kubelet version
	// uses it rather than render again.
	planned     *render.Result
	plannedFrom string
}

// runKubernetes drives the four stages in order. A stage whose nodes are all
// done only verifies them, so a Run always walks every stage and picks up
// where the cluster is.
func (e *Engine) runKubernetes(ctx context.Context, opts Options) error {
	target, err := stages.ParseVersion(opts.Target)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}

	if e.Kube == nil || e.Dynamic == nil || e.Talos == nil {
		return errors.New("the engine needs Kube, Dynamic and Talos clients")
	}

	c, err := kube.StartCache(ctx, e.Kube)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("start: %w", ctx.Err())
		}

		return &PauseError{Reason: err.Error(), Action: actionResume, Err: err}
	}
	defer c.Stop()

	r := &kubeRun{e: e, opts: opts, target: target, cache: c, applier: kube.NewManifestApplier(e.Dynamic, e.Kube.Discovery())}

	all := stages.KubernetesStages()
	for i, s := range all {
		if err := r.runStage(ctx, i+1, len(all), s); err != nil {
			return err
		}
	}

	return e.leftBehind(ctx, all[len(all)-1].Name(), target, kubeletBehind(target),
		"the next run takes it through every stage from APIServers")
}

// runStage runs one stage: read the stage's nodes, plan each one's render,
// and when any needs an apply run the checks and the pre-pull first; then
// visit the nodes in order, and for KubeProxy wait for the rollout.
//
// The last stage, which visits every node, then takes the nodes whose hold was
// removed while it ran: they are not left behind by a run that says it
// succeeded. (A node released during an earlier stage is visited by the
// next, which takes it through the stages it missed first.)
func (r *kubeRun) runStage(ctx context.Context, index, total int, s stages.KubernetesStage) error {
	name := s.Name()
	r.e.stage(index, total, name)
	r.restarts, r.joins = 0, map[string]int{}

	held, err := r.runJoined(ctx, s, nil)

	for err == nil && s.VisitsWorkers() && len(held) > 0 {
		var released map[string]bool

		if released, err = r.released(ctx, name, held); err != nil || len(released) == 0 {
			break
		}

		names := slices.Sorted(maps.Keys(released))
		r.e.step(name, "released", "hold removed during the stage: %s, taken now", strings.Join(names, ", "))

		held, err = r.runJoined(ctx, s, released)
	}

	return err
}

// maxJoinRestarts caps how often one stage starts again because a control plane
// joined: more joins than that in one stage are a node flapping in and out of the
// cluster (its Node deleted and registered again), not machines being added.
const maxJoinRestarts = 5

// runJoined is runNodes, started again on the whole stage whenever a control plane
// joins the cluster while it runs (a joinedError): the joined node, behind the
// cluster, goes first. Past maxJoinRestarts in the stage it pauses instead.
func (r *kubeRun) runJoined(ctx context.Context, s stages.KubernetesStage, only map[string]bool) ([]discovery.Node, error) {
	for {
		held, err := r.runNodes(ctx, s, only)

		var joined *joinedError
		if !errors.As(err, &joined) {
			return held, err
		}

		for _, n := range joined.nodes {
			r.joins[n]++
		}

		if r.restarts++; r.restarts > maxJoinRestarts {
			return nil, r.tooManyJoins(ctx, s.Name())
		}

		r.e.step(s.Name(), "joined", "control plane %s joined during the stage: reading the cluster again, it goes first",
			strings.Join(joined.nodes, ", "))

		if err := r.waitJoined(ctx, s.Name(), joined.nodes); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name(), err)
		}

		only = nil
	}
}

// tooManyJoins pauses a stage that control planes joined more than maxJoinRestarts
// times, naming them, the most frequent first.
func (r *kubeRun) tooManyJoins(ctx context.Context, stage string) error {
	names := slices.Collect(maps.Keys(r.joins))
	slices.SortFunc(names, func(a, b string) int {
		if c := r.joins[b] - r.joins[a]; c != 0 {
			return c
		}

		return strings.Compare(a, b)
	})

	seen := make([]string, 0, len(names))
	for _, n := range names {
		seen = append(seen, fmt.Sprintf("%s %d time(s)", n, r.joins[n]))
	}

	reason := fmt.Sprintf("control planes joined the cluster %d times during the stage (%s), more than the %d restarts a stage takes: "+
		"a node flapping in and out of the cluster?", r.restarts, summarize(seen), maxJoinRestarts)

	return r.pause(ctx, stage, names[0], reason,
		fmt.Sprintf("find why it comes and goes (kubectl get node %s -w; talosctl -n <its IP> logs kubelet), fix it "+
			"or hold it (kubectl annotate node %s %s=flapping), then resume", names[0], names[0], discovery.HoldAnnotation), errors.New(reason))
}

// released returns the nodes of held that no longer carry the hold annotation, as
// the run's watch cache has them (a Node it does not have is read from the
// apiserver). A hold removed a moment before that the cache has not seen yet is
// caught by the run's last look (leftBehind).
func (r *kubeRun) released(ctx context.Context, stage string, held []discovery.Node) (map[string]bool, error) {
	out := map[string]bool{}

	for _, n := range held {
		node, ok := r.cache.Node(n.Name)
		if !ok {
			var err error

			node, err = r.getNode(ctx, n.Name)
			if apierrors.IsNotFound(err) {
				continue
			}

			if err != nil {
				return nil, r.pause(ctx, stage, n.Name, "read the Node: "+err.Error(), actionResume, err)
			}
		}

		if _, still := node.Annotations[discovery.HoldAnnotation]; !still {
			out[n.Name] = true
		}
	}

	return out, nil
}

// runNodes runs stage s on its nodes (only those named in only, when it is not
// nil) and returns the nodes it left alone because they are held.
func (r *kubeRun) runNodes(ctx context.Context, s stages.KubernetesStage, only map[string]bool) ([]discovery.Node, error) {
	name := s.Name()

	snap, visit, held, err := r.observe(ctx, s)
	if err != nil {
		return nil, err
	}

	if only != nil {
		visit = onlyNodes(visit, only)
	}

	if reason := r.skipReason(s, snap, visit); reason != "" {
		r.e.step(name, "skipped", "%s", reason)

		return held, nil
	}

	for _, n := range held {
		if only != nil {
			break
		}

		if node, ok := r.cache.Node(n.Name); ok && kube.CordonedByIchor(node) {
			r.e.node(name, n.Name, PhaseHeld, "held (%s), still cordoned by ichor: remove the hold to finish it, or kubectl uncordon %s",
				holdText(n), n.Name)

			continue
		}

		r.e.node(name, n.Name, PhaseHeld, "held (%s)", holdText(n))
	}

	var pending []*stageNode

	for _, group := range visit {
		for _, n := range group {
			res, err := r.render(s, n.Node, n.Talos.Config)
			if err == nil {
				n.plannedFrom, err = render.Hash(n.Talos.Config)
			}

			if err != nil {
				return nil, r.pause(ctx, name, n.Name, err.Error(), renderAction(n.Name, err), err)
			}

			n.changes, n.planned = res.Changed, res
			if len(n.changes) == 0 {
				r.e.node(name, n.Name, PhasePending, "nothing to apply: to verify")

				continue
			}

			pending = append(pending, n)
			r.e.node(name, n.Name, PhasePending, "to apply: %s", describeChanges(n.changes))
		}
	}

	if len(pending) > 0 {
		if err := r.checkStage(ctx, s, pending); err != nil {
			return nil, err
		}

		if err := r.prePull(ctx, s, snap, pending); err != nil {
			return nil, err
		}
	} else if err := r.checkInvariant(ctx, name, ""); err != nil {
		return nil, err
	}

	var synced bool

	for _, group := range visit {
		ok, err := r.runGroup(ctx, s, group)
		if err != nil {
			return nil, err
		}

		synced = synced || ok
	}

	if _, isProxy := s.(stages.KubeProxy); isProxy && synced {
		return held, r.rollout(ctx, name)
	}

	return held, nil
}

// onlyNodes keeps the nodes of visit named in only, in their groups.
func onlyNodes(visit [][]*stageNode, only map[string]bool) [][]*stageNode {
	var out [][]*stageNode

	for _, group := range visit {
		var kept []*stageNode

		for _, n := range group {
			if only[n.Name] {
				kept = append(kept, n)
			}
		}

		if len(kept) > 0 {
			out = append(out, kept)
		}
	}

	return out
}

// observe reads the cluster for stage s: the snapshot, the nodes to visit
// grouped in visiting order (each with its Talos version and active config),
// and the held nodes of the stage.
func (r *kubeRun) observe(ctx context.Context, s stages.KubernetesStage) (*discovery.Snapshot, [][]*stageNode, []discovery.Node, error) {
	name := s.Name()

	var snap *discovery.Snapshot

	err := kube.Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		snap, err = (&discovery.Discoverer{Kube: r.e.Kube}).Discover(ctx)

		return err
	})
	if err != nil {
		return nil, nil, nil, r.pause(ctx, name, "", "read the cluster: "+err.Error(), actionResume, err)
	}

	var (
		candidates, held []discovery.Node
		ips              []string
		byIP             = map[string]*discovery.Node{}
	)

	r.known = map[string]bool{}

	for _, n := range snap.Nodes {
		r.known[n.Name] = true

		if !n.ControlPlane && !s.VisitsWorkers() {
			continue
		}

		if n.Held {
			held = append(held, n)

			continue
		}

		if !n.IsTalos() {
			err := fmt.Errorf("node %q runs %q, not Talos", n.Name, n.OSImage)

			return nil, nil, nil, r.pause(ctx, name, n.Name, err.Error(),
				fmt.Sprintf("hold it (kubectl annotate node %s %s=not-talos), then resume", n.Name, discovery.HoldAnnotation), err)
		}

		if n.InternalIP == "" {
			err := fmt.Errorf("node %q has no InternalIP address to reach its Talos API", n.Name)

			return nil, nil, nil, r.pause(ctx, name, n.Name, err.Error(), "check the Node's status.addresses, then resume", err)
		}

		candidates = append(candidates, n)
	}

	for i := range candidates {
		byIP[candidates[i].InternalIP] = &candidates[i]
		ips = append(ips, candidates[i].InternalIP)
	}

	err = talos.ForEach(ctx, ips, r.opts.Concurrency, func(ctx context.Context, ip string) error {
		ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
		defer cancel()

		n := byIP[ip]

		version, err := r.e.Talos.Version(ctx, ip)
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}

		cfg, err := r.e.Talos.MachineConfig(ctx, ip)
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}

		n.Talos = discovery.NewTalos(version, cfg)

		return nil
	})
	if err != nil {
		return nil, nil, nil, r.pause(ctx, name, "", "read the nodes' Talos side: "+stages.FirstLine(err), actionTalosAccess, err)
	}

	order, err := stages.OrderNodes(candidates, stages.OrderOptions{Self: r.opts.Self, MaxUnavailable: r.opts.MaxUnavailable})
	if err != nil {
		return nil, nil, nil, r.pause(ctx, name, "", err.Error(), actionResume, err)
	}

	return snap, r.groups(s, order), held, nil
}

// groups lays out the nodes of a stage in visiting order: each control plane
// alone, then, in the Kubelets stage, the workers in batches of
// MaxUnavailable. In the Kubelets stage a node ichor cordoned (a run that
// stopped mid-node, such as the runner evicted by its own drain) goes first
// in its group: it is finished before anything else is made unavailable.
// Next come the nodes behind the cluster (an earlier stage's render still
// changes them: a hold removed, a control plane added): a control plane whose
// apiserver is behind holds every other controller-manager back, so it
// catches up before any other node takes the stage.
func (r *kubeRun) groups(s stages.KubernetesStage, order stages.Order) [][]*stageNode {
	_, kubelets := s.(stages.Kubelets)

	rank := func(n discovery.Node) int {
		if node, ok := r.cache.Node(n.Name); kubelets && ok && kube.CordonedByIchor(node) {
			return 0
		}

		if n.Talos != nil {
			// An error here is the visit's to report.
			if earlier, err := r.earlierStage(s, n, n.Talos.Config); err == nil && earlier != nil {
				return 1
			}
		}

		return 2
	}

	inVisitOrder := func(nodes []discovery.Node) []*stageNode {
		out := make([]*stageNode, 0, len(nodes))
		ranks := map[*stageNode]int{}

		for _, n := range nodes {
			sn := &stageNode{Node: n}
			out = append(out, sn)
			ranks[sn] = rank(n)
		}

		slices.SortStableFunc(out, func(a, b *stageNode) int { return ranks[a] - ranks[b] })

		return out
	}

	var groups [][]*stageNode

	for _, n := range inVisitOrder(order.ControlPlanes) {
		groups = append(groups, []*stageNode{n})
	}

	if !s.VisitsWorkers() {
		return groups
	}

	workers := inVisitOrder(slices.Concat(order.Workers...))
	for start := 0; start < len(workers); start += r.opts.MaxUnavailable {
		groups = append(groups, workers[start:min(start+r.opts.MaxUnavailable, len(workers))])
	}

	return groups
}

// skipReason says why a stage does not run: only KubeProxy can be skipped,
// when there is no kube-proxy DaemonSet or no control plane's config enables
// kube-proxy.
func (r *kubeRun) skipReason(s stages.KubernetesStage, snap *discovery.Snapshot, visit [][]*stageNode) string {
	if _, isProxy := s.(stages.KubeProxy); !isProxy {
		return ""
	}

	if reason := s.SkipReason(snap); reason != "" {
		return reason
	}

	for _, group := range visit {
		for _, n := range group {
			if n.Talos.KubeProxyEnabled {
				return ""
			}
		}
	}

	return "kube-proxy is disabled in the control planes' machine config (cluster.proxy.disabled)"
}

// earlierStage returns the first stage before s whose render changes node n's active
// config cfg, nil when every earlier stage is done on it.
func (r *kubeRun) earlierStage(s stages.KubernetesStage, n discovery.Node, cfg config.Provider) (stages.KubernetesStage, error) {
	for _, st := range stages.KubernetesStages() {
		if st.Name() == s.Name() {
			return nil, nil
		}

		res, err := r.render(st, n, cfg)
		if err != nil {
			return nil, err
		}

		if len(res.Changed) > 0 {
			return st, nil
		}
	}

	return nil, nil
}

// renderAction says what to do about a render of node that failed: an image
// whose tag says no version wants a tag.
func renderAction(node string, err error) string {
	if errors.Is(err, stages.ErrNoVersionTag) {
		return stages.UnreadableAction(node)
	}

	return actionResume
}

// render returns the stage's config for node n (its kubelet version read
// from its Node) from its active config cfg.
func (r *kubeRun) render(s stages.KubernetesStage, n discovery.Node, cfg config.Provider) (*render.Result, error) {
	return stages.RenderStage(s, n, cfg, r.target)
}

// runGroup visits a group's nodes (several at once for a worker batch) and
// returns whether any synced the bootstrap manifests. Every node of a batch
// finishes its step; the first failure, in the batch's order, is returned.
func (r *kubeRun) runGroup(ctx context.Context, s stages.KubernetesStage, group []*stageNode) (bool, error) {
	synced := make([]bool, len(group))
	errs := make([]error, len(group))

	var wg sync.WaitGroup

	for i, n := range group {
		wg.Go(func() { synced[i], errs[i] = r.visit(ctx, s, n) })
	}

	wg.Wait()

	for _, err := range errs {
		if err != nil {
			return false, err
		}
	}

	return slices.Contains(synced, true), nil
}

// visit takes one node through the stage: read its Node and active config,
// render; if the render differs, refuse a staged config, check the
// invariant would hold, (Kubelets) cordon and drain, dry run and apply, check
// the invariant; then verify, (Kubelets) uncordon, (KubeProxy) sync the
// bootstrap manifests. It reports whether it synced them.
func (r *kubeRun) visit(ctx context.Context, s stages.KubernetesStage, sn *stageNode) (bool, error) {
	stage, name, ip := s.Name(), sn.Name, sn.InternalIP
	_, kubelets := s.(stages.Kubelets)
	_, proxy := s.(stages.KubeProxy)

	node, err := r.getNode(ctx, name)
	if err != nil {
		return false, r.pause(ctx, stage, name, "read the Node: "+err.Error(), actionResume, err)
	}

	cfg, activeHash, err := r.activeConfig(ctx, name, ip)
	if err != nil {
		return false, r.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
	}

	current := sn.Node
	current.KubeletVersion = node.Status.NodeInfo.KubeletVersion

	// One stage's worth of change per apply: a node an earlier stage did not visit (a
	// hold removed mid-upgrade, a control plane added) takes the earlier stages first,
	// from APIServers, one apply each, then this one.
	earlier, err := r.earlierStage(s, current, cfg)
	if err != nil {
		return false, r.pause(ctx, stage, name, err.Error(), renderAction(name, err), err)
	}

	if earlier != nil {
		r.e.node(stage, name, PhasePending, "behind the cluster: takes stage %s first", earlier.Name())

		if _, err := r.visit(ctx, earlier, &stageNode{Node: sn.Node}); err != nil {
			return false, err
		}

		return r.visit(ctx, s, &stageNode{Node: sn.Node})
	}

	// The pins come from the Node: render again unless the config and the
	// kubelet version are those the stage's start rendered from.
	res := sn.planned
	if res == nil || activeHash != sn.plannedFrom || current.KubeletVersion != sn.KubeletVersion {
		if res, err = r.render(s, current, cfg); err != nil {
			return false, r.pause(ctx, stage, name, err.Error(), renderAction(name, err), err)
		}
	}

	ours := kube.CordonedByIchor(node)
	applied := res.Hash != activeHash

	var (
		drained string
		// settle: a control plane's kubelet moves, and may restart its static pods.
		settle  = applied && kubelets && sn.ControlPlane
		mirrors map[discovery.Component]types.UID
	)

	if applied {
		if err := r.refuseStaged(ctx, stage, name, ip, cfg); err != nil {
			return false, err
		}

		if err := r.predictApply(ctx, stage, sn, res); err != nil {
			return false, err
		}

		if kubelets {
			if drained, err = r.e.cordonAndDrain(ctx, r.opts, stage, name); err != nil {
				return false, err
			}

			ours = true
		}

		if settle {
			mirrors = r.mirrorUIDs(name)
		}

		if err := r.apply(ctx, stage, name, ip, res); err != nil {
			return false, err
		}

		if err := r.checkApplied(ctx, stage, sn, res); err != nil {
			return false, err
		}
	}

	expect := r.expect(s, sn, res)
	r.e.node(stage, name, PhaseVerifying, "waiting for %s", describeExpect(expect))

	start := time.Now()

	err = r.cache.Wait(ctx, r.opts.VerifyTimeout, r.cache.NodeVerified(expect), func(waiting string) {
		r.e.node(stage, name, PhaseVerifying, "%s (waited %s)", waiting, time.Since(start).Round(time.Second))
	})
	if err != nil {
		var timeout *kube.WaitTimeoutError
		if errors.As(err, &timeout) {
			reason := fmt.Sprintf("verify: %s", timeout.Waiting)
			if kubelets && ours {
				reason += " (the node stays cordoned)"
			}

			return false, r.pause(ctx, stage, name, fmt.Sprintf("%s after %s", reason, timeout.After),
				verifyAction(name), fmt.Errorf("node %q: verify: %w", name, err))
		}

		return false, r.pause(ctx, stage, name, "verify: "+err.Error(), actionResume, fmt.Errorf("node %q: verify: %w", name, err))
	}

	if settle {
		if err := r.settleStaticPods(ctx, stage, name, mirrors); err != nil {
			return false, err
		}
	}

	if kubelets && ours {
		if err := kube.Uncordon(ctx, r.e.Kube, name); err != nil {
			return false, r.pause(ctx, stage, name, err.Error(), actionResume, err)
		}
	}

	if applied {
		if err := r.recheckInvariant(ctx, stage, name); err != nil {
			return false, err
		}
	}

	synced := false

	if proxy {
		if synced, err = r.syncManifests(ctx, stage, sn, res); err != nil {
			return false, err
		}
	}

	done := describeExpect(expect)

	switch {
	case applied && drained != "":
		done = drained + ", " + done
	case !applied:
		done = "already applied; " + done
	}

	if kubelets && ours {
		done += ", uncordoned"
	}

	if synced {
		done += ", bootstrap manifests synced"
	}

	r.e.node(stage, name, PhaseDone, "%s", done)

	return synced, nil
}

// getNode reads a Node, retrying what is temporary.
func (r *kubeRun) getNode(ctx context.Context, name string) (*corev1.Node, error) {
	var node *corev1.Node

	err := kube.Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		node, err = r.e.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})

		return err
	})

	return node, err
}

// activeConfig reads a node's active config and its hash.
func (r *kubeRun) activeConfig(ctx context.Context, name, ip string) (config.Provider, string, error) {
	ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	cfg, err := r.e.Talos.MachineConfig(ctx, ip)
	if err != nil {
		return nil, "", fmt.Errorf("node %q: read machine config: %w", name, err)
	}

	hash, err := render.Hash(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("node %q: %w", name, err)
	}

	return cfg, hash, nil
}

// refuseStaged refuses a node whose persistent config differs from its
// active one: a change staged for the next reboot, which an apply would
// overwrite (render.Staged, as the Talos upgrade refuses it).
func (r *kubeRun) refuseStaged(ctx context.Context, stage, name, ip string, active config.Provider) error {
	readCtx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	persistent, err := r.e.Talos.PersistentMachineConfig(readCtx, ip)
	if err != nil {
		err = fmt.Errorf("node %q: read persistent machine config: %w", name, err)

		return r.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
	}

	where, err := render.Staged(active, persistent)
	if err != nil {
		return r.pause(ctx, stage, name, err.Error(), actionResume, err)
	}

	if where == "" {
		return nil
	}

	err = fmt.Errorf("node %q: a machine config change is staged for the next reboot (%s): applying would overwrite it", name, where)

	return r.pause(ctx, stage, name, err.Error(), render.StagedAction(ip), err)
}

// apply dry-runs, then applies, the render, each call under its own
// deadline.
func (r *kubeRun) apply(ctx context.Context, stage, name, ip string, res *render.Result) error {
	what := describeChanges(res.Changed)

	r.e.node(stage, name, PhaseApplying, "dry run: %s", what)

	if _, err := r.applyCall(ctx, ip, res.Bytes, true); err != nil {
		err = fmt.Errorf("node %q: apply (dry run): %w", name, err)

		return r.pause(ctx, stage, name, err.Error(), "nothing was changed on the node: "+actionResume, err)
	}

	r.e.node(stage, name, PhaseApplying, "applying %s (NO_REBOOT, bound %s)", what, r.opts.ApplyTimeout)

	result, err := r.applyCall(ctx, ip, res.Bytes, false)
	if err != nil {
		err = fmt.Errorf("node %q: apply: %w", name, err)

		return r.pause(ctx, stage, name, err.Error(),
			"the node may or may not have the new config; resuming reads it again and applies or only verifies", err)
	}

	r.e.node(stage, name, PhaseApplying, "applied %s (%s)", what, result.Mode)

	return nil
}

// applyCall is one ApplyConfiguration call under its own ApplyTimeout.
func (r *kubeRun) applyCall(ctx context.Context, ip string, data []byte, dryRun bool) (talos.ApplyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.ApplyTimeout)
	defer cancel()

	return r.e.Talos.Apply(ctx, ip, data, dryRun)
}

// expect is what verifies node sn in stage s with render res: Ready, the
// stage's static pods on their rendered tags and Ready, and in the Kubelets
// stage the kubelet on its rendered version.
func (r *kubeRun) expect(s stages.KubernetesStage, sn *stageNode, res *render.Result) kube.NodeExpect {
	images := render.Images(res.Config)
	e := kube.NodeExpect{Node: sn.Name, StaticPods: map[discovery.Component]string{}}

	if _, kubelets := s.(stages.Kubelets); kubelets {
		e.KubeletVersion = render.TagOf(images[discovery.Kubelet])
	}

	if sn.ControlPlane {
		for _, c := range discovery.StaticPodComponents() {
			if image, ok := images[c]; ok && s.AtTarget(c) {
				e.StaticPods[c] = render.TagOf(image)
			}
		}
	}

	return e
}

// pause is Engine.pause for this run.
func (r *kubeRun) pause(ctx context.Context, stage, node, reason, action string, err error) error {
	return r.e.pause(ctx, stage, node, reason, action, err)
}

func verifyAction(node string) string {
	return fmt.Sprintf("see what is not Ready (kubectl describe node %s; kubectl -n %s get pods -o wide --field-selector spec.nodeName=%s), fix it, then resume",
		node, discovery.StaticPodNamespace, node)
}

// describeChanges says what a render changes: "kube-apiserver v1.35.4 ->
// v1.36.3, kubelet v1.35.4 -> v1.36.3".
func describeChanges(changes []render.Change) string {
	parts := make([]string, 0, len(changes))
	for _, c := range changes {
		part := fmt.Sprintf("%s %s -> %s", c.Component, orUnknownTag(render.TagOf(c.From)), render.TagOf(c.To))
		if c.DroppedDigest != "" {
			part += fmt.Sprintf(" (digest %s dropped)", c.DroppedDigest)
		}

		parts = append(parts, part)
	}

	return strings.Join(parts, ", ")
}

// describeExpect says what verification waits for: "node Ready, kubelet
// v1.36.3, kube-apiserver v1.36.3 Ready".
func describeExpect(e kube.NodeExpect) string {
	parts := []string{"node Ready"}

	if e.KubeletVersion != "" {
		parts = append(parts, "kubelet "+e.KubeletVersion)
	}

	for _, c := range discovery.StaticPodComponents() {
		if tag, ok := e.StaticPods[c]; ok {
			parts = append(parts, fmt.Sprintf("%s %s Ready", c, tag))
		}
	}

	return strings.Join(parts, ", ")
}

func holdText(n discovery.Node) string {
	if n.HoldReason == "" {
		return discovery.HoldAnnotation
	}

	return discovery.HoldAnnotation + ": " + n.HoldReason
}

func orUnknownTag(tag string) string {
	if tag == "" {
		return "(default)"
	}

	return tag
}
