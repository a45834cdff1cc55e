package placement

import "fmt"

// Reason says why a request cannot be placed.
type Reason int

const (
	// ReasonInvalid: the request itself is malformed (negative amounts, ...).
	ReasonInvalid Reason = iota + 1
	// ReasonNoModel: no GPU in the cluster has an allowed model.
	ReasonNoModel
	// ReasonTooLarge: no node could hold it even when empty.
	ReasonTooLarge
	// ReasonNoCapacity: it fits an empty node but no node has room now.
	ReasonNoCapacity
	// ReasonConstraint: nodes have room, but no node's usable GPUs meet the request's
	// Together or Apart constraint.
	ReasonConstraint
)

func (r Reason) String() string {
	switch r {
	case ReasonInvalid:
		return "invalid request"
	case ReasonNoModel:
		return "no GPU of an allowed model"
	case ReasonTooLarge:
		return "larger than any node"
	case ReasonNoCapacity:
		return "no node has enough free capacity"
	case ReasonConstraint:
		return "no node meets the GPU constraint"
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// UnplaceableError is returned when a request cannot be placed.
type UnplaceableError struct {
	Request string
	Reason  Reason
	Detail  string
}

func (e *UnplaceableError) Error() string {
	msg := fmt.Sprintf("cannot place %q: %s", e.Request, e.Reason)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}
