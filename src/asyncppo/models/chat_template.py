"""The ChatML chat template with tool calls and its special tokens, shipped with the tiny tokenizer.

`models/tiny.py` attaches it to the tokenizer it builds; the policy server renders conversations with it through
`tokenizer.apply_chat_template`. Rendered shape:

    <|im_start|>system\n{system}\n\n# Tools ... <tools>\n{tool json}\n</tools> ...<|im_end|>\n   (only with tools)
    <|im_start|>{role}\n{content}<|im_end|>\n                                          (system / user / assistant)
    <|im_start|>assistant\n{content}\n<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n
    <|im_start|>tool\n<tool_response>\n{content}\n</tool_response><|im_end|>\n
    <|im_start|>assistant\n                                                  (add_generation_prompt=True)
"""

PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
THINK_START = "<think>"
THINK_END = "</think>"

# The order fixes the ids: special tokens take ids 0..8 ahead of the byte alphabet, so `<|pad|>` is 0.
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    IM_START,
    IM_END,
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
    THINK_START,
    THINK_END,
)

# transformers compiles templates with trim_blocks and lstrip_blocks, and every tag here also strips the
# whitespace before it ({%- / {{-), so the indentation below is for reading only: all output text comes from
# explicit string literals. Tools and call arguments go through transformers' `tojson` (ensure_ascii=False,
# so non-ASCII text stays as typed). Arguments that arrive as a JSON string (the OpenAI wire shape) are
# inserted verbatim, so the tokens the model saw are exactly the tokens the client sent.
CHAT_TEMPLATE = """\
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for part in content %}
            {%- if part.type == 'text' %}
                {{- part.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- set conversation = messages %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\\n\\n' }}
        {%- set conversation = messages[1:] %}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions. Their signatures, one JSON object per line:\\n<tools>\\n' }}
    {%- for tool in tools %}
        {{- (tool | tojson) + '\\n' }}
    {%- endfor %}
    {{- '</tools>\\n\\nTo call a function, reply with one block per call:\\n<tool_call>\\n' }}
    {{- '{"name": <function-name>, "arguments": <arguments-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- endif %}
{%- for message in conversation %}
    {{- '<|im_start|>' + message.role + '\\n' }}
    {%- if message.role == 'tool' %}
        {{- '<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' }}
    {%- else %}
        {{- render_content(message.content) }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call %}
            {%- if call.arguments is string %}
                {%- set arguments = call.arguments %}
            {%- else %}
                {%- set arguments = call.arguments | tojson %}
            {%- endif %}
            {%- if not loop.first or message.content %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": ' + (call.name | tojson) + ', "arguments": ' + arguments + '}\\n</tool_call>' }}
        {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
