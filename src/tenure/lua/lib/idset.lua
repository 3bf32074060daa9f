-- Shared by the id set scripts: a key of another type is refused by name.
local function idset_refuse_types(keys, wanted)
    for i, key in ipairs(keys) do
        local kind = redis.call('TYPE', key)['ok']
        if kind ~= 'none' and kind ~= wanted[i] then
            return 'WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not the ' .. wanted[i]
                .. ' of an id set'
        end
    end
    return nil
end
