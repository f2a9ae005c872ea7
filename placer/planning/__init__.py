"""Planning: the planner that wires shapes, costs and a partitioner, and the plan document."""
