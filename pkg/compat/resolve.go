package compat

import (
	"context"
	"fmt"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Resolved is the release of a minor a Resolver found to go through.
type Resolved struct {
	// Version is the release, vX.Y.Z.
	Version Version
	// Source is where it came from, e.g. api.SourceRegistry.
	Source string
	// Detail says where, in one line ("newest 1.35 patch tagged in
	// registry.example.com/mirror/kube-apiserver and 4 more repositories").
	Detail string
}

// Resolver finds the release of a minor that an intermediate hop goes to.
type Resolver interface {
	// NewestPatch returns the newest release of minor's major.minor (its patch is
	// ignored), or an error that says, in one line, why none was found.
	NewestPatch(ctx context.Context, minor Version) (Resolved, error)
}

// via is the operator's intermediate versions (--via), one per minor, and which hop
// used each.
type via struct {
	byMinor map[[2]uint64]Version
	order   []Version
	usedBy  map[[2]uint64]string
}

func minorKey(v Version) [2]uint64 { return [2]uint64{v.Major, v.Minor} }

// newVia indexes versions by minor; two versions of one minor are refused.
func newVia(versions []Version) (*via, error) {
	out := &via{byMinor: map[[2]uint64]Version{}, usedBy: map[[2]uint64]string{}}

	for _, v := range versions {
		if prev, dup := out.byMinor[minorKey(v)]; dup {
			return nil, &Refusal{
				Reason: fmt.Sprintf("--via %s and %s name the same minor %s", prev, v, v.MinorString()),
				Action: "pass one release per minor with --via",
			}
		}

		out.byMinor[minorKey(v)] = v
		out.order = append(out.order, v)
	}

	return out, nil
}

// lookup returns the operator's release of minor m, if any.
func (v *via) lookup(m Version) (Version, bool) {
	r, ok := v.byMinor[minorKey(m)]

	return r, ok
}

// use records that a hop of kind took the operator's release of m; the same release
// taken by both kinds is refused (a minor both a Kubernetes and a Talos hop would go
// through cannot be told apart on the command line).
func (v *via) use(kind string, m Version) error {
	if prev, ok := v.usedBy[minorKey(m)]; ok && prev != kind {
		return &Refusal{
			Reason: fmt.Sprintf("--via %s fits both a Talos and a Kubernetes hop of the path", v.byMinor[minorKey(m)]),
			Action: "leave it out and let the planner find each release, or plan the hops one by one",
		}
	}

	v.usedBy[minorKey(m)] = kind

	return nil
}

// unused refuses the operator's releases no hop went through: a --via that the path
// ignores is a mistake about the path, said before anything runs.
func (v *via) unused(hops []Hop) error {
	var left []string

	for _, r := range v.order {
		if _, ok := v.usedBy[minorKey(r)]; !ok {
			left = append(left, r.String())
		}
	}

	if len(left) == 0 {
		return nil
	}

	through := make([]string, 0, len(hops))
	for _, h := range hops {
		through = append(through, h.label())
	}

	goes := "has no hop"
	if len(through) > 0 {
		goes = "goes " + strings.Join(through, ", ")
	}

	return &Refusal{
		Reason: fmt.Sprintf("--via %s: the path does not go through that minor (it %s)", strings.Join(left, ","), goes),
		Action: "pass only releases of the minors the path goes through with --via",
	}
}

// resolve finds the release of an intermediate hop to minor m: the operator's (--via),
// else the resolver's; a clear refusal when neither gives one.
func resolve(ctx context.Context, kind string, m Version, v *via, r Resolver) (Resolved, error) {
	if given, ok := v.lookup(m); ok {
		if err := v.use(kind, m); err != nil {
			return Resolved{}, err
		}

		return Resolved{Version: given, Source: api.SourceVia, Detail: "--via " + given.String()}, nil
	}

	name := kindName(kind)
	action := fmt.Sprintf("pass the %s release to go through with --via v%s.<patch>", name, m.MinorString())

	if r == nil {
		return Resolved{}, &Refusal{Reason: fmt.Sprintf("%s %s: no release of that minor named, and none to look one up", name, m.MinorString()), Action: action}
	}

	got, err := r.NewestPatch(ctx, m)
	if err != nil {
		if ctx.Err() != nil {
			return Resolved{}, fmt.Errorf("%s %s: %w", name, m.MinorString(), ctx.Err())
		}

		return Resolved{}, &Refusal{Reason: fmt.Sprintf("%s %s: %v", name, m.MinorString(), err), Action: action}
	}

	if !got.Version.SameMinor(m) {
		return Resolved{}, &Refusal{
			Reason: fmt.Sprintf("%s %s: the lookup gave %s, another minor", name, m.MinorString(), got.Version),
			Action: action,
		}
	}

	return got, nil
}

// kindName is the hop kind as a sentence says it.
func kindName(kind string) string {
	if kind == api.UpgradeTalos {
		return "Talos"
	}

	return "Kubernetes"
}
