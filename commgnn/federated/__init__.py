"""Federated graph learning across organisations (``commgnn federate``).

Each organisation (client) keeps its subgraph; a server (rank 0) combines their model
updates. The parts, one concern per module:

* :mod:`.config` -- every federated config table (``[split]``, ``[federated]``, ``[dp]``, ...);
* :mod:`.client_split` -- which client owns each node: Louvain, METIS, label-skewed (Dirichlet)
  or a file (:mod:`.client_map_file` reads it); :mod:`.client_data` -- each client's data
  and the split's statistics (:mod:`.splits` keeps the old import names);
* :mod:`.model`, :mod:`.client` -- the GCN and a client's local training;
* :mod:`.engine` -- the rounds: FedAvg / FedProx, DP, uplink codecs, secure sums, the gate
  (:mod:`.builders` sets a federation up; :mod:`.state` checkpoints it);
* :mod:`.secagg` -- secure aggregation (Bonawitz et al. / SecAgg+);
* :mod:`.uplink` -- update codecs whose sums survive secure aggregation;
* :mod:`.dp` -- client-level differential privacy with opacus's RDP accountant;
* :mod:`.robust`, :mod:`.byzantine` -- robust aggregation and a Byzantine harness;
* :mod:`.policy` -- the governance policy and the gate every payload passes;
* :mod:`.fairness` -- accuracy per client, degree quartile and class; bytes per client.
"""
