"""The controller's state and decisions, with no I/O: ``Controller``, the one object the
service, the API and the tools call.

Each decision lives with its concept (``brokers``: registry, leases, failover;
``topics``: lifecycle and publishers; ``plans``: plans, draining, the TB Adaptor;
``replicas``: ALL_PUBLISHERS replica sets; ``views``: read-outs; ``persistence``: saved
rows and restore) as a function over the state (``model.ControllerState``); the
controller offers them as its methods. Every decision takes the controller's clock
(``now``, seconds) and returns the actions for the service to carry out (set a broker's
sub-bucket; a plan changed). The service persists what a change touched (``topic_json``
of its topics, ``brokers_json``) and rebuilds with ``restore`` on restart.
"""

from __future__ import annotations

from srtm.control import brokers, persistence, plans, replicas, topics, views
from srtm.control.actions import Action
from srtm.control.model import ControllerState
from srtm.control.validate import ControlError

__all__ = ["ControlError", "Controller"]


class Controller(ControllerState):
    """The controller: its state (``ControllerState``'s fields) and every decision over
    it, each a function of its concept module taken as a method."""

    # -- brokers: registry, leases, failover ---------------------------------------------
    register = brokers.register
    report = brokers.report
    repairs = brokers.repairs
    deregister = brokers.deregister
    silent = brokers.silent
    gone = brokers.gone
    shares = brokers.shares
    bucket_doc = brokers.bucket_doc

    # -- topics: lifecycle and publishers ------------------------------------------------
    check_new_topic = topics.check_new_topic
    create_topic = topics.create_topic
    delete_topic = topics.delete_topic
    change_topic = topics.change_topic
    set_utility = topics.set_utility
    set_rate = topics.set_rate
    add_publishers = topics.add_publishers
    remove_publisher = topics.remove_publisher
    join_open = topics.join_open
    set_join = topics.set_join

    # -- plans -----------------------------------------------------------------------------
    ledger = plans.ledger_of
    fleet = plans.fleet
    over = plans.over
    note_over = plans.note_over
    sums = plans.sums
    move = plans.move
    set_assignment = plans.set_assignment

    # -- replication -----------------------------------------------------------------------
    set_replicas = replicas.set_replicas
    replicate = replicas.replicate
    unreplicate = replicas.unreplicate
    rehome = replicas.rehome

    # -- read-outs and nsqlookupd's view -----------------------------------------------------
    plan = views.plan
    assign = views.assign
    is_publisher = views.is_publisher
    topic_doc = views.topic_doc
    topic_brokers = views.topic_brokers
    producers = views.producers
    lookup = views.lookup
    topic_names = views.topic_names
    nodes = views.nodes

    # -- persistence -----------------------------------------------------------------------
    to_json = persistence.to_json
    brokers_json = persistence.brokers_json
    topic_json = persistence.topic_json
    restore = persistence.restore

    # -- time ------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Action]:
        """Mark silent brokers down (placing their publishers again), place publishers
        left without a broker when brokers came (back), then run the TB Adaptor.

        Silence is measured on the awake clock: a gap between ticks longer than
        ``stall_after_s`` is the controller's own stall and counts as no time at all, so
        every broker looking silent at once after a SIGSTOP or a blocked loop does not
        unassign anyone: each gets its remaining timeout from the resumption."""
        if self.last_tick_s is not None and now - self.last_tick_s > self.stall_after_s:
            self.stalled_s += now - self.last_tick_s
            self.stalls += 1
        self.last_tick_s = now
        self.ticks += 1
        actions = brokers.expire(self, now)
        if self.replace_pending:
            self.replace_pending = False
            actions += plans.place_unassigned(self)
        for topic in self.topics.values():
            if topic.status != "fitting":  # fitting owns the plan until it is done
                actions += plans.drain(self, topic)
            actions += plans.adapt_topic(self, topic, now)
        return actions + replicas.rehome(self)
