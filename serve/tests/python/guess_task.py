"""A number-guessing task for AgentRL's Python worker, used by Agentry's interop test.

Instance `i` hides the number (37 * i + 11) % 100; index "ten" hides 10. The agent calls
`guess(number)` and hears "higher", "lower" or "correct"; a correct guess ends the episode with
reward 1 and metrics {"success": true}; eight wrong guesses end it with "task limit reached".
"""

import json

from agentrl.worker.task import Task, Session
from agentrl.worker.typings import (
    AgentCancelledException,
    RewardHistoryItem,
    SampleStatus,
    TaskSampleExecutionResult,
)

TOOLS = [{
    "type": "function",
    "function": {
        "name": "guess",
        "description": "Guess the hidden number.",
        "parameters": {
            "type": "object",
            "properties": {"number": {"type": "integer", "description": "your guess"}},
            "required": ["number"],
            "additionalProperties": False,
        },
    },
}]


class GuessTask(Task):
    def __init__(self, max_turns: int = 8, **kwargs):
        super().__init__(tools=TOOLS, **kwargs)
        self.max_turns = max_turns

    def get_indices(self):
        return list(range(10)) + ["ten"]

    async def start_sample(self, index, session: Session) -> TaskSampleExecutionResult:
        secret = 10 if index == "ten" else (37 * int(index) + 11) % 100
        try:
            session.inject({"role": "system", "content": "You play a guessing game."})
            session.inject({"role": "user", "content": "Guess my number between 0 and 99."})
            for _ in range(self.max_turns):
                output = await session.action()
                call = output.messages[-1].get("tool_calls", [None])[0]
                if call is None:
                    session.inject({"role": "user", "content": "Call the guess tool."})
                    continue
                arguments = call["function"]["arguments"]
                if isinstance(arguments, str):
                    arguments = json.loads(arguments)
                number = int(arguments["number"])
                if number == secret:
                    session.inject({"role": "tool", "content": "correct", "tool_call_id": call["id"]})
                    session.inject(RewardHistoryItem(reward=1.0, metrics={"success": True}))
                    return TaskSampleExecutionResult(status=SampleStatus.COMPLETED)
                answer = "higher" if number < secret else "lower"
                session.inject({"role": "tool", "content": answer, "tool_call_id": call["id"]})
            session.inject(RewardHistoryItem(reward=0.0, metrics={"success": False}))
            return TaskSampleExecutionResult(status=SampleStatus.TASK_LIMIT_REACHED)
        except AgentCancelledException:
            return TaskSampleExecutionResult(status=SampleStatus.CANCELLED)
