package controller

import (
	"fmt"
)

// reasonOverQuota is the rejection of a GPU that the claim's share would put over quota.
const reasonOverQuota = "over quota"

// quotaCheck checks a request against its namespace's quota, with the sizes known before a
// GPU is chosen (compute derived from memory is checked per GPU, by overQuotaWith). Caller
// holds the model's lock.
func (c *Controller) quotaCheck(in *input, rq *request) *waitReason {
	if rq.whole {
		return nil
	}
	p, ns := in.pol, in.claim.Namespace
	if p.QuotaMemory != nil {
		q, mem := p.QuotaMemory.Value(), rq.mem*rq.count
		if used := c.model.nsMem[ns]; used+mem > q {
			return &waitReason{reason: ReasonOverQuota, quota: true, message: fmt.Sprintf(
				"over the GPU memory quota of namespace %s (%s: %s): %s in use, this claim needs %s, %s over; it will be placed when quota frees up",
				ns, p.DisplayName(), p.QuotaMemory.String(), fmtBytes(used), fmtBytes(mem), fmtBytes(used+mem-q))}
		}
	}
	if p.QuotaCompute != nil && rq.comp != nil {
		q, need := *p.QuotaCompute, *rq.comp*rq.count
		if used := c.model.nsComp[ns]; used+need > q {
			return &waitReason{reason: ReasonOverQuota, quota: true, message: fmt.Sprintf(
				"over the GPU compute quota of namespace %s (%s: %d%%): %d%% in use, this claim needs %d%%, %d%% over; it will be placed when quota frees up",
				ns, p.DisplayName(), q, used, need, used+need-q)}
		}
	}
	return nil
}

// overQuotaWith reports whether one more share of mem and comp on a chosen GPU would put
// the namespace over quota. Caller holds the model's lock.
func (c *Controller) overQuotaWith(in *input, mem, comp int64) bool {
	p, ns := in.pol, in.claim.Namespace
	return (p.QuotaMemory != nil && c.model.nsMem[ns]+mem > p.QuotaMemory.Value()) ||
		(p.QuotaCompute != nil && c.model.nsComp[ns]+comp > *p.QuotaCompute)
}
